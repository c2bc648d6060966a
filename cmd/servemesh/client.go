package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
)

// clientFlags are the flags of every API command, defined here once.
type clientFlags struct {
	server, tokenFile, output, caFile string
	failoverWait                      time.Duration
	verbose                           bool
}

// addClientFlags adds the API flags to cmd and its subcommands.
func addClientFlags(cmd *cobra.Command, f *clientFlags) {
	server := os.Getenv("SERVEMESH_SERVER")
	if server == "" {
		server = "127.0.0.1:18001"
	}
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.server, "server", server, "the controller's API address, or several comma-separated; $SERVEMESH_SERVER sets the default")
	fs.StringVar(&f.tokenFile, "token-file", os.Getenv("SERVEMESH_TOKEN_FILE"), "file with the API bearer token; $SERVEMESH_TOKEN_FILE sets the default")
	fs.StringVar(&f.caFile, "ca-file", os.Getenv("SERVEMESH_CA_FILE"), "PEM file of the CA that signed the controller's HTTPS certificate, for https:// servers; $SERVEMESH_CA_FILE sets the default, and without either the system's CAs are trusted")
	fs.StringVarP(&f.output, "output", "o", "table", "output of reads: "+strings.Join(outputs, ", ")+" (wide: a table with more columns)")
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "say more when a call fails: the answer's HTTP status and the error's kind")
	fs.DurationVar(&f.failoverWait, "failover-wait", api.DefaultFailoverWait, "how long a call waits for a controller that leads and answers (a leader's failover), trying each given one; 0 tries each once")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputs, cobra.ShellCompDirectiveNoFileComp))
}

// client returns an API client for the flags; it tells cmd's stderr when a
// call waits for a leader.
func (f *clientFlags) client(cmd *cobra.Command) (*api.Client, error) {
	if !slices.Contains(outputs, f.output) {
		return nil, fmt.Errorf("-o %q: use one of %s", f.output, strings.Join(outputs, ", "))
	}
	token, err := api.ReadTokenFile(f.tokenFile)
	if err != nil {
		return nil, err
	}
	c := api.NewClient(f.server, token)
	c.FailoverWait = f.failoverWait
	c.Waiting = func(why error, upTo time.Duration) {
		fmt.Fprintf(cmd.ErrOrStderr(), "servemesh: no controller at %s leads yet (%v); waiting up to %s (--failover-wait)\n", f.server, why, upTo)
	}
	if f.caFile != "" {
		ca, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		if err := c.TrustCA(ca); err != nil {
			return nil, fmt.Errorf("--ca-file %s: %w", f.caFile, err)
		}
	}
	return c, nil
}

// nounCommand is a command that only groups verbs (backend, endpoint, ...),
// with the API flags.
func nounCommand(use, short string, f *clientFlags, verbs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Args: cobra.ArbitraryArgs, RunE: needSubcommand}
	addClientFlags(c, f)
	c.AddCommand(verbs...)
	return c
}
