package main

import (
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite the golden help and message texts in testdata")

// TestHelpGolden pins every command's help: a flag, a default or a line of
// text that changes shows in review (make testdata rewrites them).
func TestHelpGolden(t *testing.T) {
	unsetClientEnv(t)
	root := newRootCommand(slog.New(slog.NewTextHandler(io.Discard, nil)))
	paths := [][]string{nil}
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" {
			continue
		}
		paths = append(paths, []string{c.Name()})
		for _, v := range c.Commands() {
			paths = append(paths, []string{c.Name(), v.Name()})
		}
	}
	for _, p := range paths {
		code, out, errOut := runCLI(append(p, "-h")...)
		if code != 0 {
			t.Errorf("servemesh %v -h: code %d, stderr %q", p, code, errOut)
		}
		name := strings.Join(append([]string{"servemesh"}, p...), "-")
		testutil.Golden(t, filepath.Join("testdata", "help", name+".txt"), []byte(out), *update)
	}
}

// TestMessagesGolden pins what the CLI says to mistakes it can catch
// without a controller: each message names the problem and the fix.
func TestMessagesGolden(t *testing.T) {
	unsetClientEnv(t)
	var b strings.Builder
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"backend", "frobnicate"},
		{"completion", "tcsh"},
		{"status", "--server", "127.0.0.1:1"},
		{"status", "-o", "xml"},
		{"traffic", "set", "e", "a=x", "--server", "127.0.0.1:1"},
		{"backend", "update", "b", "--autoscale-max", "3", "--server", "127.0.0.1:1"},
		{"apply"},
		{"validate", "a", "b"},
	} {
		code, _, errOut := runCLI(args...)
		b.WriteString("$ servemesh " + strings.Join(args, " ") + "\n")
		b.WriteString(errOut)
		b.WriteString("(exit " + string(rune('0'+code)) + ")\n\n")
	}
	testutil.Golden(t, filepath.Join("testdata", "messages.txt"), []byte(b.String()), *update)
}

// unsetClientEnv clears the variables that set the API flags' defaults,
// which the goldens would otherwise show.
func unsetClientEnv(t *testing.T) {
	for _, v := range []string{"SERVEMESH_SERVER", "SERVEMESH_TOKEN_FILE", "SERVEMESH_CA_FILE"} {
		t.Setenv(v, "")
	}
}
