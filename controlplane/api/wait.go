package api

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Progress is how far a backend is from its desired replicas, all ready.
type Progress struct {
	Backend        string
	Ready, Desired int
	// Nodes are, by node, its ready and its running replicas there.
	Nodes map[string][2]int
}

// Done reports whether the backend runs its desired replicas, all ready.
func (p Progress) Done() bool {
	running := 0
	for _, n := range p.Nodes {
		running += n[1]
	}
	return p.Ready == p.Desired && running == p.Desired
}

// String reads "model-v3: 2/4 ready (node-1 1/2, node-2 1/2)".
func (p Progress) String() string {
	var nodes []string
	for _, n := range slices.Sorted(maps.Keys(p.Nodes)) {
		nodes = append(nodes, fmt.Sprintf("%s %d/%d", n, p.Nodes[n][0], p.Nodes[n][1]))
	}
	s := fmt.Sprintf("%s: %d/%d ready", p.Backend, p.Ready, p.Desired)
	if len(nodes) > 0 {
		s += " (" + strings.Join(nodes, ", ") + ")"
	}
	return s
}

// CrashLoopExits is how many exits make a replica that never got ready
// crash-looping: WaitReady then stops waiting for it.
const CrashLoopExits = 3

// WaitPoll is how often WaitReady reads the status.
const WaitPoll = 500 * time.Millisecond

var exits = regexp.MustCompile(regexp.QuoteMeta(wire.ExitedNote) + ` (\d+) times`)

// WaitReady waits until each of the process backends named runs its
// desired replicas, every one ready, telling progress (if not nil) at each
// reading. It fails, saying why, when ctx ends first (with what each
// replica not ready says), when the controller cannot place a backend's
// replicas, or when a replica that is not ready has exited
// CrashLoopExits times (with the end of its log).
func (c *Client) WaitReady(ctx context.Context, backends []string, progress func([]Progress)) error {
	for {
		report, err := c.Status(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s to be ready: %w", strings.Join(backends, ", "), err)
		}
		ps, err := readiness(report, backends)
		if progress != nil && ps != nil {
			progress(ps)
		}
		if err != nil {
			return err
		}
		if allDone(ps) {
			return nil
		}
		select {
		case <-ctx.Done():
			return notReadyError(report, ps, ctx.Err())
		case <-time.After(WaitPoll):
		}
	}
}

func allDone(ps []Progress) bool {
	for _, p := range ps {
		if !p.Done() {
			return false
		}
	}
	return true
}

// readiness is the progress of backends in report, or why they will not
// get ready.
func readiness(report StatusReport, backends []string) ([]Progress, error) {
	byName := map[string]BackendStatus{}
	for _, b := range report.Backends {
		byName[b.Name] = b
	}
	var out []Progress
	for _, name := range backends {
		b, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("backend %q is not in the controller's status: was it deleted?", name)
		}
		for _, problem := range report.Problems {
			if strings.HasPrefix(problem, PlacementProblemPrefix(name)) {
				return nil, fmt.Errorf("backend %q cannot be ready: %s", name, problem)
			}
		}
		if err := crashLoop(name, b.Replicas); err != nil {
			return nil, err
		}
		p := Progress{Backend: name, Ready: b.Ready, Desired: b.Desired, Nodes: map[string][2]int{}}
		for _, r := range b.Replicas {
			if r.State != meshspec.Running {
				continue
			}
			n := p.Nodes[r.Node]
			n[1]++
			if r.Ready {
				n[0]++
			}
			p.Nodes[r.Node] = n
		}
		out = append(out, p)
	}
	return out, nil
}

// crashLoop says which of backend's running replicas that is not ready
// has exited CrashLoopExits times, if one has.
func crashLoop(backend string, replicas []ReplicaStatus) error {
	for _, r := range replicas {
		if r.State != meshspec.Running || r.Ready {
			continue
		}
		if m := exits.FindStringSubmatch(r.Note); m != nil {
			if count, _ := strconv.Atoi(m[1]); count >= CrashLoopExits {
				return fmt.Errorf("backend %q cannot be ready: its replica %s on node %s is crash-looping (fix its command, or delete the backend): %s", backend, r.Tag, r.Node, r.Note)
			}
		}
	}
	return nil
}

// notReadyError says which backends are not ready at the deadline, and
// what their replicas that are not ready say.
func notReadyError(report StatusReport, ps []Progress, cause error) error {
	var lines []string
	for _, p := range ps {
		if p.Done() {
			continue
		}
		lines = append(lines, p.String())
		for _, b := range report.Backends {
			if b.Name != p.Backend {
				continue
			}
			for _, r := range b.Replicas {
				if r.State == meshspec.Running && !r.Ready {
					lines = append(lines, fmt.Sprintf("  replica %s on %s: %s", r.Tag, r.Node, cmp.Or(r.Note, "not ready")))
				}
			}
		}
	}
	return fmt.Errorf("not ready in time (%w):\n%s", cause, strings.Join(lines, "\n"))
}

// PlacementProblemPrefix begins the status problem that says why backend's
// replicas cannot all be placed.
func PlacementProblemPrefix(backend string) string { return "placing " + backend + "'s replicas: " }
