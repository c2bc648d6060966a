package envoy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// Envoy with hot restart on sets PR_SET_PDEATHSIG(SIGTERM): it ends when
// its parent does (its model is a long-lived parent, such as Envoy's
// hot-restarter.py). So that a node's Envoy outlives the agent that
// starts it, its parent is a small process of its own (servemesh
// envoy-parent, RunParent): started detached by the agent, it starts
// Envoy in its own process group, passes it nothing and waits for it,
// then exits with its exit status. Signals to the group (Stop, Kill)
// reach Envoy; the parent ignores those Envoy handles. Each epoch of a
// hot restart has a parent of its own.

// ParentCommand is the subcommand of the servemesh binary that runs
// RunParent.
const ParentCommand = "envoy-parent"

// RunParent runs the Envoy binary with args as its child and waits for
// it, returning the exit code to exit with.
func RunParent(binary string, args []string) int {
	// Caught, not ignored: an ignored signal would stay ignored in Envoy.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	cmd := exec.Command(binary, args...) //nolint:noctx // it lives as long as Envoy does
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if st, ok := exit.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				return 128 + int(st.Signal())
			}
			return exit.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "servemesh %s: %v\n", ParentCommand, err)
		return 1
	}
	return 0
}
