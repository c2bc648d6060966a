package main

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"github.com/google/shlex"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestValidate(t *testing.T) {
	code, out, _ := runCLI("validate", "../../examples/demo.yaml")
	if code != 0 || !strings.Contains(out, "is valid: 4 backends, 2 endpoints") {
		t.Fatalf("validate demo.yaml: code %d, out %q", code, out)
	}
	if code, out, errOut := runCLI("validate", "../../examples/inference.yaml"); code != 0 || !strings.Contains(out, "is valid: 3 backends, 1 endpoints") {
		t.Fatalf("validate inference.yaml: code %d, out %q %q", code, out, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("backends: [{name: a}]\nendpoints: [{name: e, route: /e, traffic: {a: 0.5}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI("validate", bad)
	if code != 1 || !strings.Contains(errOut, `endpoint "e".traffic (line 2, column 43): weights sum to 0.5`) {
		t.Fatalf("validate bad.yaml: code %d, stderr %q", code, errOut)
	}
}

func TestBootstrapPrintsAnEnvoyBootstrap(t *testing.T) {
	code, out, errOut := runCLI("bootstrap", "--node-id", "n7", "--public", "0.0.0.0:8081", "--xds-protocol", "delta")
	if code != 0 {
		t.Fatalf("code %d: %s", code, errOut)
	}
	var b bootstrapv3.Bootstrap
	if err := protoyaml.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if b.GetNode().GetId() != "n7" || b.GetDynamicResources().GetAdsConfig().GetApiType().String() != "DELTA_GRPC" {
		t.Fatalf("bootstrap node %q api %s", b.GetNode().GetId(), b.GetDynamicResources().GetAdsConfig().GetApiType())
	}
}

// TestBootstrapOfAMeshOnlyNode: --public none announces no public
// listener, so the node gets none (and never asks for the public table).
func TestBootstrapOfAMeshOnlyNode(t *testing.T) {
	code, out, errOut := runCLI("bootstrap", "--node-id", "n8", "--public", "none")
	if code != 0 {
		t.Fatalf("code %d: %s", code, errOut)
	}
	var b bootstrapv3.Bootstrap
	if err := protoyaml.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	node, err := wire.ProxyNodeFromEnvoy(b.GetNode())
	if err != nil || node.Public() || node.MeshPort != 15001 || node.Reachable != nil {
		t.Fatalf("node %+v, %v; want a mesh-only node with its mesh listener, reaching every endpoint", node, err)
	}
}

// TestBootstrapOfANodeReachingSomeEndpoints: --reachable-endpoints names
// the endpoints (sorted, each once), "none" none.
func TestBootstrapOfANodeReachingSomeEndpoints(t *testing.T) {
	for flag, want := range map[string][]string{"b, a,b": {"a", "b"}, "none": {}} {
		code, out, errOut := runCLI("bootstrap", "--node-id", "n9", "--reachable-endpoints", flag)
		if code != 0 {
			t.Fatalf("%q: code %d: %s", flag, code, errOut)
		}
		var b bootstrapv3.Bootstrap
		if err := protoyaml.Unmarshal([]byte(out), &b); err != nil {
			t.Fatal(err)
		}
		node, err := wire.ProxyNodeFromEnvoy(b.GetNode())
		if err != nil || node.Reachable == nil || !slices.Equal(node.Reachable, want) {
			t.Fatalf("--reachable-endpoints %q: node reaches %q (%v); want %q", flag, node.Reachable, err, want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "name a command"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"backend"}, 2, "name a command"},
		{[]string{"backend", "frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"backnd", "list"}, 2, `unknown command "backnd"; did you mean "backend"?`},
		{[]string{"backend", "lst"}, 2, `unknown command "lst"; did you mean "list"?`},
		{[]string{"endpoint", "delte", "e"}, 2, `unknown command "delte"; did you mean "delete"?`},
		{[]string{"serve"}, 1, "--config is required"},
		{[]string{"bootstrap", "--public", "nonsense"}, 1, `--public "nonsense": want IP:port, like 127.0.0.1:8080, or none`},
		{[]string{"demo", "--public", "none"}, 1, "the demo serves its endpoints on the public listener"},
		{[]string{"bootstrap", "--reachable-endpoints", "a,,b"}, 1, `reachable endpoint "" is not an endpoint name`},
		{[]string{"bootstrap", "--xds-protocol", "rest"}, 1, `xds protocol "rest" is unknown`},
		{[]string{"bootstrap", "--no-such-flag"}, 1, "unknown flag: --no-such-flag"},
		{[]string{"validate", "a", "b"}, 1, "name one config file"},
		{[]string{"version", "extra"}, 1, `unknown command "extra"`},
		{[]string{"backend", "create", "b", "--arg", "x", "--server", "127.0.0.1:1"}, 1, "go with --command"},
		{[]string{"backend", "create", "b", "--command", "x", "--env", "NOEQUALS", "--server", "127.0.0.1:1"}, 1, `--env "NOEQUALS": want KEY=VALUE`},
		{[]string{"backend", "update", "b", "--autoscale-max", "3", "--server", "127.0.0.1:1"}, 1, "needs at least --autoscale-max and --autoscale-target"},
		{[]string{"backend", "update", "b", "--autoscale-off", "--autoscale-max", "3", "--server", "127.0.0.1:1"}, 1, "--autoscale-off goes without"},
		{[]string{"backend", "create", "--server", "127.0.0.1:1"}, 1, "want one backend name"},
		{[]string{"traffic", "set", "e", "a=x", "--server", "127.0.0.1:1"}, 1, `"x" is not a number`},
		// Flags may come after positional arguments, for every command.
		{[]string{"traffic", "set", "e", "a=1", "--server", "127.0.0.1:1", "--failover-wait", "0"}, 1, "127.0.0.1:1"},
		// One controller that nothing answers at: at once, with what to check
		// (the default --failover-wait would otherwise hold the test 15 s).
		{[]string{"status", "--server", "127.0.0.1:1"}, 1, "at http://127.0.0.1:1: no controller answers (connection refused): is a controller running there? Give its address with --server or $SERVEMESH_SERVER"},
		{[]string{"backend", "list", "-o", "xml", "--server", "127.0.0.1:1"}, 1, `-o "xml": use one of table, wide, json, yaml`},
		{[]string{"version", "-o", "wide"}, 1, `-o "wide": use json or yaml, or leave it out`},
	} {
		code, _, errOut := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("servemesh %v: code %d stderr %q; want code %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestHelpAtEveryLevel: -h works on the root, on every noun and on every
// verb, and exits 0.
func TestHelpAtEveryLevel(t *testing.T) {
	root := newRootCommand(slog.New(slog.NewTextHandler(io.Discard, nil)))
	var paths [][]string
	for _, c := range root.Commands() {
		paths = append(paths, []string{c.Name()})
		for _, v := range c.Commands() {
			paths = append(paths, []string{c.Name(), v.Name()})
		}
	}
	paths = append(paths, nil)
	for _, p := range paths {
		code, out, errOut := runCLI(append(p, "-h")...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("servemesh %v -h: code %d, stdout %q, stderr %q", p, code, out, errOut)
		}
	}
	code, out, _ := runCLI("backend", "create", "-h")
	if code != 0 || !strings.Contains(out, "--arg stringArray") || !strings.Contains(out, "--server string") {
		t.Errorf("backend create -h lists its flags as --flag, and the API flags: %s", out)
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_servemesh", "zsh": "#compdef servemesh", "fish": "complete -c servemesh"} {
		code, out, errOut := runCLI("completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("completion %s: code %d, stderr %q, output lacks %q", shell, code, errOut, want)
		}
	}
}

// TestREADMECommandLines parses every servemesh command line the README
// and the docs (docs/*.md) document with the CLI's own parser: each names
// a command, takes the flags it is given, and the number of arguments it
// expects. Nothing runs.
func TestREADMECommandLines(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, page := range append([]string{"../../README.md"}, pages...) {
		lines = append(lines, readmeCommandLines(t, page)...)
	}
	if len(lines) < 15 {
		t.Fatalf("found only %d servemesh command lines in README.md and docs/; the parser below is off", len(lines))
	}
	root := newRootCommand(slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, line := range lines {
		args, err := shlex.Split(line)
		if err != nil {
			t.Errorf("%s: %v", line, err)
			continue
		}
		cmd, rest, err := root.Find(args[1:])
		if err != nil || cmd == root || cmd.RunE == nil {
			t.Errorf("%s: names no runnable command (found %q, %v)", line, cmd.CommandPath(), err)
			continue
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Errorf("%s: %v", line, err)
			continue
		}
		if cmd.Args != nil {
			if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
				t.Errorf("%s: %v", line, err)
			}
		}
	}
}

// readmeCommandLines returns the servemesh command lines in the README's
// shell code blocks, with continuation lines joined and comments, pipes
// and redirections cut off.
func readmeCommandLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	start := regexp.MustCompile(`^(bin/)?servemesh\s`)
	var out []string
	inBlock, pending := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if lang, ok := strings.CutPrefix(line, "```"); ok {
			// Shell blocks alone hold command lines (not a diagram's).
			inBlock = !inBlock && lang == "sh"
			continue
		}
		if !inBlock {
			continue
		}
		line = strings.TrimSpace(line)
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		if !start.MatchString(line) {
			continue
		}
		for _, cut := range []string{" #", " |", " >", " &"} {
			if i := strings.Index(line, cut); i >= 0 {
				line = line[:i]
			}
		}
		out = append(out, strings.TrimSpace(line))
	}
	return out
}

// TestEndpointPickerFlags: --endpoint-picker and its two switches patch
// the fields given, so a switch turned off is sent as false, and merged
// into a stored picker; no such flag leaves the picker alone.
func TestEndpointPickerFlags(t *testing.T) {
	parse := func(args ...string) meshspec.BackendConfigPatch {
		var c configFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		p, err := c.patch(fs)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	stored := meshspec.BackendConfig{EndpointPicker: &meshspec.EndpointPicker{Address: "10.0.0.5:9002", FailOpen: true}}
	for _, c := range []struct {
		args []string
		want *meshspec.EndpointPicker
	}{
		{[]string{"--cpus", "1"}, stored.EndpointPicker},
		{[]string{"--endpoint-picker", "10.0.0.6:9002"}, &meshspec.EndpointPicker{Address: "10.0.0.6:9002", FailOpen: true}},
		{[]string{"--endpoint-picker-fail-open=false", "--endpoint-picker-tls"}, &meshspec.EndpointPicker{Address: "10.0.0.5:9002", TLS: true}},
	} {
		mp, err := parse(c.args...).MergePatch()
		if err != nil {
			t.Fatal(err)
		}
		picker := *stored.EndpointPicker
		got, err := mp.Apply(meshspec.BackendConfig{EndpointPicker: &picker})
		if err != nil || !reflect.DeepEqual(got.EndpointPicker, c.want) {
			t.Errorf("%v on %+v: %+v %v; want %+v", c.args, *stored.EndpointPicker, got.EndpointPicker, err, c.want)
		}
	}
}

// TestLoadAwareFlags: --load-aware and the --load-* flags set a backend's
// load-aware setting, --load-aware-off removes it, not both at once.
func TestLoadAwareFlags(t *testing.T) {
	parse := func(args ...string) (meshspec.BackendConfigPatch, error) {
		var c configFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return c.patch(fs)
	}
	p, err := parse("--load-aware")
	if err != nil || p.LoadAware == nil || p.LoadAware.Off || !reflect.DeepEqual(p.LoadAware.LoadAware, meshspec.LoadAware{}) {
		t.Errorf("--load-aware: %+v %v", p.LoadAware, err)
	}
	p, err = parse("--load-metrics-path", "/metrics", "--load-queue-metric", "vllm:num_requests_waiting", "--load-queue-limit", "8")
	if err != nil || p.LoadAware == nil || p.LoadAware.MetricsPath != "/metrics" || p.LoadAware.QueueLimit != 8 {
		t.Errorf("--load-*: %+v %v", p.LoadAware, err)
	}
	if p, err = parse("--first-byte-timeout", "500ms"); err != nil || p.FirstByteTimeoutS == nil || *p.FirstByteTimeoutS != 0.5 {
		t.Errorf("--first-byte-timeout 500ms: %+v %v", p.FirstByteTimeoutS, err)
	}
	p, err = parse("--load-weight", "prefix=2,queue=0", "--load-weight", "ttfb=0.5")
	if err != nil || p.LoadAware == nil || !reflect.DeepEqual(p.LoadAware.Weights, map[string]float64{"prefix": 2, "queue": 0, "ttfb": 0.5}) {
		t.Errorf("--load-weight: %+v %v", p.LoadAware, err)
	}
	if _, err = parse("--load-weight", "prefix=lots"); err == nil || !strings.Contains(err.Error(), "--load-weight prefix") {
		t.Errorf("--load-weight prefix=lots: %v, want an error naming the flag", err)
	}
	if p, err = parse("--load-aware-off"); err != nil || p.LoadAware == nil || !p.LoadAware.Off {
		t.Errorf("--load-aware-off: %+v %v", p.LoadAware, err)
	}
	if _, err = parse("--load-aware-off", "--load-queue-limit", "3"); err == nil {
		t.Error("--load-aware-off with another --load flag was taken")
	}
	if p, err = parse("--cpus", "1"); err != nil || p.LoadAware != nil {
		t.Errorf("no --load flag: %+v %v", p.LoadAware, err)
	}
}

// TestXDSCacheSwitch: $SERVEMESH_XDS_CACHE is on, off or refused, by the
// commands that serve xDS, before anything starts.
func TestXDSCacheSwitch(t *testing.T) {
	for v, want := range map[string]bool{"": false, "on": false, "off": true} {
		t.Setenv(xdsCacheEnv, v)
		if off, err := xdsCacheOff(); err != nil || off != want {
			t.Errorf("%s=%q: off %v, %v; want %v", xdsCacheEnv, v, off, err, want)
		}
	}
	t.Setenv(xdsCacheEnv, "false")
	for _, args := range [][]string{{"controller"}, {"serve", "--config", "../../examples/demo.yaml"}} {
		code, _, errOut := runCLI(args...)
		if code == 0 || !strings.Contains(errOut, `$SERVEMESH_XDS_CACHE="false": set on (the default) or off`) {
			t.Errorf("%v with %s=false: code %d, stderr %q", args, xdsCacheEnv, code, errOut)
		}
	}
}

// TestWaitTimeoutIsOneName: every command that waits (--wait) bounds the
// wait with --wait-timeout (backends once said --timeout and endpoints
// --wait-timeout); --timeout, where it is not another setting, is the
// deprecated old name of the same bound.
func TestWaitTimeoutIsOneName(t *testing.T) {
	var walk func(c *cobra.Command) int
	walk = func(c *cobra.Command) int {
		n := 0
		if c.Flags().Lookup("wait") != nil {
			n++
			if c.Flags().Lookup("wait-timeout") == nil {
				t.Errorf("%s has --wait and no --wait-timeout", c.CommandPath())
			}
			if f := c.Flags().Lookup("timeout"); f != nil && f.Usage == deprecatedTimeout && !f.Hidden {
				t.Errorf("%s: --timeout, the wait's bound's old name, is not hidden", c.CommandPath())
			}
		}
		for _, sub := range c.Commands() {
			n += walk(sub)
		}
		return n
	}
	if n := walk(newRootCommand(slog.New(slog.DiscardHandler))); n < 5 {
		t.Fatalf("%d commands have --wait; the walk found too few to check", n)
	}
}
