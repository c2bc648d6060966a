package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/servemesh/servemesh/internal/protoyaml"
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
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("backends: [{name: a}]\nendpoints: [{name: e, route: /e, traffic: {a: 0.5}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI("validate", bad)
	if code != 1 || !strings.Contains(errOut, `endpoints[0] ("e").traffic: weights sum to 0.5`) {
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

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: servemesh <command>"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"serve"}, 1, "--config is required"},
		{[]string{"bootstrap", "--public", "nonsense"}, 1, `--public "nonsense"`},
		{[]string{"bootstrap", "--xds-protocol", "rest"}, 1, `xds protocol "rest" is unknown`},
		{[]string{"validate", "a", "b"}, 1, "name one config file"},
		{[]string{"version", "extra"}, 1, `unexpected arguments "extra"`},
		{[]string{"backend", "create", "b", "--arg", "x", "--server", "127.0.0.1:1"}, 1, "go with --command"},
		{[]string{"backend", "create", "b", "--command", "x", "--env", "NOEQUALS", "--server", "127.0.0.1:1"}, 1, `--env "NOEQUALS": want KEY=VALUE`},
		{[]string{"backend", "update", "b", "--autoscale-max", "3", "--server", "127.0.0.1:1"}, 1, "needs at least --autoscale-max and --autoscale-target"},
		{[]string{"backend", "update", "b", "--autoscale-off", "--autoscale-max", "3", "--server", "127.0.0.1:1"}, 1, "--autoscale-off goes without"},
		{[]string{"traffic", "set", "e", "a=x", "--server", "127.0.0.1:1"}, 1, `"x" is not a number`},
		{[]string{"backend", "list", "-o", "yaml", "--server", "127.0.0.1:1"}, 1, `-o "yaml": use table or json`},
	} {
		code, _, errOut := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("servemesh %v: code %d stderr %q; want code %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}
