package main

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSystemdUnitsNameRealFlags: every flag the units in deploy/systemd
// pass exists on the command they run, and the agent's unit stops the
// agent alone (KillMode=process), so a restart keeps the node's Envoy and
// replicas serving.
func TestSystemdUnitsNameRealFlags(t *testing.T) {
	units, err := filepath.Glob("../../deploy/systemd/*.service")
	if err != nil || len(units) != 2 {
		t.Fatalf("units %v, %v", units, err)
	}
	root := newRootCommand(slog.New(slog.NewTextHandler(io.Discard, nil)))
	flag := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	for _, unit := range units {
		raw, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(raw), "\\\n", " ")
		var exec string
		for _, line := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
				exec = rest
			}
		}
		fields := strings.Fields(exec)
		if len(fields) < 2 || !strings.HasSuffix(fields[0], "/servemesh") {
			t.Fatalf("%s: ExecStart %q does not run servemesh", unit, exec)
		}
		cmd, _, err := root.Find(fields[1:2])
		if err != nil {
			t.Fatalf("%s: servemesh %s: %v", unit, fields[1], err)
		}
		for _, m := range flag.FindAllStringSubmatch(exec, -1) {
			if cmd.Flags().Lookup(m[1]) == nil {
				t.Errorf("%s: servemesh %s has no flag --%s", unit, fields[1], m[1])
			}
		}
		if fields[1] == "agent" && !strings.Contains(text, "\nKillMode=process\n") {
			t.Errorf("%s: the agent's unit must stop the agent alone (KillMode=process), or a restart stops the node's data plane", unit)
		}
	}
}

// TestSystemdUnitsAreSandboxed: the units confine what they run, as
// systemd scores it (systemd-analyze security, 0 to 10, lower is safer):
// the controller needs no privilege at all; the agent, root for running
// replicas as their own users, keeps only the capabilities that needs and
// no process of its unit gains privileges by exec (issue 58, a low: the
// agent's unit scored 9.6, UNSAFE, with neither).
func TestSystemdUnitsAreSandboxed(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze (Debian's systemd, which make tools installs) is needed: %v", err)
	}
	for unit, most := range map[string]string{"servemesh-agent.service": "6.0", "servemesh-controller.service": "2.0"} {
		path := filepath.Join("../../deploy/systemd", unit)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"\nNoNewPrivileges=true\n", "\nCapabilityBoundingSet=", "\nRestrictSUIDSGID=true\n", "\nProtectKernelModules=true\n"} {
			if !strings.Contains(string(raw), want) {
				t.Errorf("%s has no %s", unit, strings.TrimSpace(want))
			}
		}
		// --threshold is in tenths of the score it prints.
		threshold := strings.ReplaceAll(most, ".", "")
		out, err := exec.CommandContext(t.Context(), analyze, "security", "--offline=true", "--threshold="+threshold, path).CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err != nil {
			t.Errorf("%s: systemd-analyze security scores it above %s: %v\n%s", unit, most, err, lines[len(lines)-1])
		}
	}
}
