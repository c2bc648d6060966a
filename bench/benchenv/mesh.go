package benchenv

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
)

// MeshOptions shape a mesh of a controller and agents.
type MeshOptions struct {
	// Work is the mesh's folder; its base name prefixes its nodes and
	// Consul keys, so meshes of one Env stay apart.
	Work      string
	Plaintext bool
	// NodeCPUs are the CPUs each node offers, one entry a node: n1 on
	// 127.0.0.2, n2 on 127.0.0.3, and so on.
	NodeCPUs []string
	// AgentArgs are more arguments for every agent, ControllerArgs for the
	// controller; ControllerEnv, more environment variables for it (say,
	// GOMEMLIMIT).
	AgentArgs, ControllerArgs, ControllerEnv []string
	// KeepDataPlane starts agents that leave their Envoy and replicas
	// serving when they stop (the default of servemesh agent), for
	// RestartAgent; Stop then removes what they left (agent --stop-all).
	KeepDataPlane bool
}

// Mesh is a controller and its agents (each with its Envoy, one worker
// thread), running.
type Mesh struct {
	Client *api.Client
	// XDSAddr is the controller's xDS address, APIAddr its API's.
	XDSAddr, APIAddr string
	Controller       *proc.Process
	Agents           []*proc.Process
	// Public are the nodes' public listeners, in node order.
	Public []string
	// WorkDirs are the nodes' work folders, in node order.
	WorkDirs []string
	stops    []func()
	env      *Env
	args     [][]string // each agent's arguments
}

// Stop stops the agents, then the controller.
func (m *Mesh) Stop() {
	for i := len(m.stops) - 1; i >= 0; i-- {
		m.stops[i]()
	}
}

// StartMesh runs a controller and one agent per o.NodeCPUs, in the default
// mode (mTLS) unless o.Plaintext, with Consul's ACLs not required.
func (e *Env) StartMesh(o MeshOptions) (*Mesh, error) {
	m := &Mesh{}
	prefix := "bench-" + filepath.Base(o.Work)
	pt := "--plaintext=" + strconv.FormatBool(o.Plaintext)
	apiAddr, xdsAddr := testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1")
	ctl, err := e.RunEnv(o.ControllerEnv, append([]string{"controller", pt, "--insecure-consul", "--consul-prefix", prefix, "--api-listen", apiAddr, "--xds-listen", xdsAddr},
		o.ControllerArgs...)...)
	if err != nil {
		return nil, err
	}
	m.Controller = ctl
	m.stops = append(m.stops, func() { _ = ctl.Stop(15 * time.Second) })
	m.env = e
	stopOnExit := "--stop-on-exit=" + strconv.FormatBool(!o.KeepDataPlane)
	for i, cpus := range o.NodeCPUs {
		id := fmt.Sprintf("n%d", i+1)
		address := fmt.Sprintf("127.0.0.%d", i+2)
		public, work := testutil.MustFreeAddr(address), filepath.Join(o.Work, id)
		args := append([]string{"agent", pt, stopOnExit, "--insecure-consul", "--consul-prefix", prefix, "--node-id", filepath.Base(o.Work) + "-" + id,
			"--address", address, "--cpus", cpus, "--xds", xdsAddr, "--public", public, "--mesh", testutil.MustFreeAddr("127.0.0.1"),
			"--inbound", testutil.MustFreeAddr(address), "--work-dir", work, "--allow-command", e.Bin, "--concurrency", "1"},
			o.AgentArgs...)
		p, err := e.Run(args...)
		if err != nil {
			m.Stop()
			return nil, err
		}
		m.Agents, m.args = append(m.Agents, p), append(m.args, args)
		m.Public, m.WorkDirs = append(m.Public, public), append(m.WorkDirs, work)
		m.stops = append(m.stops, func() {
			// An agent killed at the end of its grace (one draining
			// engines may take longer) leaves its Envoy and replicas
			// running, as one kept on purpose does: both are stopped.
			if err := m.Agents[i].Stop(15 * time.Second); err != nil || o.KeepDataPlane {
				if left, err := e.Run("agent", "--stop-all", "--stop-grace", "0", "--node-id", args[slices.Index(args, "--node-id")+1], "--work-dir", work); err == nil {
					_ = left.Wait()
				}
			}
		})
	}
	m.Client, m.XDSAddr, m.APIAddr = api.NewClient(apiAddr, ""), xdsAddr, apiAddr
	return m, nil
}

// AgentArgs are node i's agent's arguments past those every agent has.
func (m *Mesh) AgentArgs(i int) []string {
	args := m.args[i]
	if at := slices.Index(args, "--concurrency"); at >= 0 && at+2 <= len(args) {
		return args[at+2:]
	}
	return nil
}

// RestartAgent stops node i's agent (SIGTERM) and starts it again with its
// arguments and extra, kept for its later restarts (a later flag wins):
// with KeepDataPlane it adopts what the last one left.
func (m *Mesh) RestartAgent(i int, extra ...string) error {
	if err := m.Agents[i].Stop(15 * time.Second); err != nil {
		return fmt.Errorf("stop agent %d: %w", i+1, err)
	}
	m.args[i] = append(m.args[i], extra...)
	p, err := m.env.Run(slices.Clone(m.args[i])...)
	if err != nil {
		return err
	}
	m.Agents[i] = p
	return nil
}
