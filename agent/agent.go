package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/agent/picker"
	"github.com/servemesh/servemesh/agent/secrets"
	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/heartbeat"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Options configure an Agent.
type Options struct {
	Node   wire.NodeInfo
	Consul *api.Client
	// Store is the desired state the agent watches (read only).
	Store   meshspec.StateReader
	Logger  *slog.Logger
	WorkDir string // replica logs go here
	// Registerer receives the agent's metrics; nil skips them.
	Registerer prometheus.Registerer
	// DrainGrace is how long a draining replica serves at least, while the
	// nodes' Envoys stop sending it new requests; 5s when zero. Keep it
	// equal to the controller's. Then it is stopped once its requests in
	// flight have ended (InFlight), or at its backend's graceful shutdown
	// timeout.
	DrainGrace time.Duration
	// StopGrace is how long a replica has to exit after SIGTERM; 5s when zero.
	StopGrace time.Duration
	// CheckTTL is how long after the last heartbeat the node and its
	// replicas go critical; 3s when zero.
	CheckTTL time.Duration
	// ReplicaLogMB caps a replica's log: it rotates at this size, keeping
	// two older files. 10 (MiB) when zero.
	ReplicaLogMB int
	// RunAs is the user every replica runs as (a name or a uid). Empty:
	// the agent's own user, unless the agent is root, when each backend's
	// replicas run as a user of their own from ReplicaUIDs.
	RunAs string
	// ReplicaUIDs is the range each backend's replicas get a user (and
	// group) of their own from; it needs an agent run as root. Zero: when
	// the agent is root and RunAs is empty, DefaultUIDs.
	ReplicaUIDs UIDRange
	// Secrets, with mesh mTLS, are the node's identities for its Envoy
	// (started by the caller); Inbound is then the IP:port of the node's
	// inbound listener. Replicas then listen on loopback only ($HOST is
	// 127.0.0.1): other nodes reach them through the inbound listener.
	Secrets *secrets.Files
	Inbound string
	// Picker, if set, follows the replicas the agent runs, to pick them
	// for the node's Envoy (load-aware backends).
	Picker *picker.Picker
	// Views, if set, receives the node's view of each desired state the
	// agent reads, for the node's parts built before it (nil: the agent
	// keeps its own).
	Views *nodeview.Latest
	// State is where the agent keeps what the status listener reports of
	// its replicas (nil: its own).
	State *ReplicaState
	// StopOnExit stops the node's replicas when Run returns (a node
	// leaving, or the demo's Ctrl-C). Otherwise they keep running and
	// registered, for the next agent to adopt.
	StopOnExit bool
	// MeshListener is the node's mesh listener (host:port) its replicas
	// call endpoints at (wire.MeshListenerEnv); "" when it has none.
	MeshListener string
	// InFlight, if set, counts a replica's requests in flight (the node's
	// Envoy's): a draining replica is stopped once it has none. Without it
	// a draining replica is stopped after DrainGrace.
	InFlight RequestsInFlight
}

// Agent runs the replicas placed on its node.
type Agent struct {
	node                   wire.NodeInfo
	consul                 *api.Client
	store                  meshspec.StateReader
	log                    *slog.Logger
	workDir                string
	drainGrace, stopGrace  time.Duration
	checkTTL               time.Duration
	minBackoff, maxBackoff time.Duration
	logMaxMB               int
	runAs                  *syscall.Credential // nil: the agent's user, or uids
	uids                   UIDRange            // Count > 0: a user per backend (users)
	users                  *backendUsers       // loaded by Run
	secrets                *secrets.Files      // nil: no mesh mTLS
	inbound                string
	listenHost             string         // where replicas listen
	picker                 *picker.Picker // nil: none
	metrics                *metrics
	stopOnExit             bool
	meshListener           string
	inFlight               RequestsInFlight // nil: no Envoy to ask

	replicas map[string]*replica // by tag; owned by Run
	// background are the goroutines Run starts besides its replicas' own
	// loops (the node's heartbeat, drains, stops of removed replicas);
	// Run returns once they have. runCtx is Run's context.
	background sync.WaitGroup
	runCtx     context.Context
	devices    *devices
	state      *ReplicaState    // what the status listener reports of the replicas
	views      *nodeview.Latest // the desired state, as the node's parts read it
}

// Desired is the latest desired state the agent has read; nil before the
// first.
func (a *Agent) Desired() *meshspec.Model { return a.views.Model() }

// View is the node's view of Desired (nodeview), made once per desired
// state read; nil before the first.
func (a *Agent) View() *nodeview.View { return a.views.View() }

type metrics struct {
	restarts  *prometheus.CounterVec
	replicas  prometheus.Gauge
	drainCuts *prometheus.CounterVec
}

// newMetrics are an agent's metrics, unregistered.
func newMetrics() *metrics {
	return &metrics{
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "servemesh_agent_replica_restarts_total",
			Help: "Times a replica's process was restarted after it exited (Ray Serve's backend_worker_starts).",
		}, []string{"backend", "replica"}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_agent_replicas",
			Help: "Replicas this agent runs, draining ones included.",
		}),
		drainCuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "servemesh_agent_drains_cut_total",
			Help: "Draining replicas stopped at their backend's graceful shutdown timeout with requests still in flight, which were cut.",
		}, []string{"backend"}),
	}
}

// drainStart is when p's drain began, as the controller stored it (now,
// for a placement of a release that stored none).
func drainStart(p meshspec.Placement) time.Time {
	if p.Since == 0 {
		return time.Now()
	}
	return time.Unix(p.Since, 0)
}

// New returns an agent; Run starts it. It fails when RunAs names no user.
func New(o Options) (*Agent, error) {
	cred, uids, err := replicaUsers(o.RunAs, o.ReplicaUIDs)
	if err != nil {
		return nil, err
	}
	a := &Agent{node: o.Node, consul: o.Consul, store: o.Store, log: o.Logger, workDir: o.WorkDir,
		drainGrace: o.DrainGrace, stopGrace: o.StopGrace, checkTTL: o.CheckTTL,
		minBackoff: 200 * time.Millisecond, maxBackoff: 30 * time.Second, replicas: map[string]*replica{},
		metrics: newMetrics(), views: o.Views, state: o.State}
	if a.views == nil {
		a.views = &nodeview.Latest{}
	}
	if a.state == nil {
		a.state = &ReplicaState{}
	}
	if a.drainGrace == 0 {
		a.drainGrace = 5 * time.Second
	}
	if a.stopGrace == 0 {
		a.stopGrace = 5 * time.Second
	}
	if a.checkTTL == 0 {
		a.checkTTL = 3 * time.Second
	}
	if a.logMaxMB = o.ReplicaLogMB; a.logMaxMB == 0 {
		a.logMaxMB = 10
	}
	a.runAs, a.uids = cred, uids
	for name, n := range o.Node.Resources {
		if err := wire.CheckResource(name, n); err != nil {
			return nil, fmt.Errorf("agent: --resource: %w", err)
		}
	}
	a.devices = newDevices(o.Node.Resources)
	a.secrets, a.inbound, a.listenHost, a.picker, a.stopOnExit = o.Secrets, o.Inbound, o.Node.Address, o.Picker, o.StopOnExit
	a.meshListener, a.inFlight = o.MeshListener, o.InFlight
	a.node.Inbound = o.Inbound // registered: the controller checks replicas' claims against it
	if (o.Secrets == nil) != (o.Inbound == "") {
		return nil, fmt.Errorf("agent: mesh mTLS needs both the node's secrets and its inbound listener")
	}
	if o.Secrets != nil {
		a.listenHost = "127.0.0.1"
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(a.metrics.restarts, a.metrics.replicas, a.metrics.drainCuts)
	}
	return a, nil
}

// replicaUsers resolves who replicas run as: every replica as the user
// name (or uid) names; or each backend as a user of its own from uids
// (DefaultUIDs when the agent is root and neither is given); or, for an
// agent that is not root and was given neither, the agent's own user
// (nil, zero).
func replicaUsers(name string, uids UIDRange) (*syscall.Credential, UIDRange, error) {
	switch {
	case name != "" && uids.Count > 0:
		return nil, UIDRange{}, fmt.Errorf("--run-as and --replica-uids: give one; --replica-uids gives each backend's replicas a user of their own")
	case uids.Count > 0 && os.Geteuid() != 0:
		return nil, UIDRange{}, fmt.Errorf("--replica-uids: only an agent run as root can run replicas as other users; run it as root, or give --run-as")
	case uids.Count > 0:
		return nil, uids, nil
	case name == "" && os.Geteuid() == 0:
		return nil, DefaultUIDs, nil
	case name == "":
		return nil, UIDRange{}, nil
	}
	cred, err := replicaUser(name)
	return cred, UIDRange{}, err
}

// replicaUser resolves the user name (or uid) to run replicas as.
func replicaUser(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return nil, fmt.Errorf("--run-as %q: no such user; name an unprivileged user for replicas", name)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("--run-as %q: user %s has a non-numeric uid or gid", name, u.Username)
	}
	groups, err := userGroups(u)
	if err != nil {
		return nil, fmt.Errorf("--run-as %q: %w", name, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}, nil
}

// credential is the user the replicas of backend run as (nil: the
// agent's).
func (a *Agent) credential(backend string) (*syscall.Credential, error) {
	if a.users != nil {
		return a.users.credential(backend)
	}
	return a.runAs, nil
}

// replicaUID is the uid the replicas of backend run as.
func (a *Agent) replicaUID(backend string) (int, error) {
	c, err := a.credential(backend)
	if err != nil || c == nil {
		return os.Geteuid(), err
	}
	return int(c.Uid), nil
}

// userGroups are the ids of the groups u belongs to: exactly what a replica
// run as u gets, none of the agent's own supplementary groups.
func userGroups(u *user.User) ([]uint32, error) {
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("the groups of user %s: %w", u.Username, err)
	}
	groups := make([]uint32, 0, len(ids))
	for _, id := range ids {
		g, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("user %s is in a group with a non-numeric id %q", u.Username, id)
		}
		groups = append(groups, uint32(g))
	}
	return groups, nil
}

// Run registers the node, adopts the replicas a previous agent left
// running, then runs its placed replicas until ctx ends, when it leaves
// them running for the next agent (or, with StopOnExit, stops them all
// and deregisters).
func (a *Agent) Run(ctx context.Context) error {
	if err := a.prepareWorkDir(); err != nil {
		return err
	}
	unlock, err := LockWorkDir(a.workDir)
	if err != nil {
		return err
	}
	defer unlock()
	if a.uids.Count > 0 {
		if a.users, err = loadBackendUsers(a.uids, a.workDir); err != nil {
			return err
		}
	}
	a.adoptAll(ctx)
	if err := a.registerNode(); err != nil {
		return err
	}
	a.runCtx = ctx
	defer a.background.Wait() // after exit, below
	a.background.Go(func() {
		heartbeat.Run(ctx, a.consul.Agent(), wire.AgentServiceID(a.node.ID), a.checkTTL/3, heartbeat.Passing, a.log)
	})
	defer a.exit()
	a.log.Info("agent running", "node", a.node.ID, "address", a.node.Address, "cpus", a.node.CPUs, "memory_mb", a.node.MemoryMB,
		"replicas_adopted", len(a.replicas))
	if a.secrets != nil && a.users == nil && (a.runAs == nil || a.runAs.Uid == uint32(os.Geteuid())) {
		a.log.Warn("replicas run as the agent's own user, so they could read the node's private keys; give --run-as another user",
			"secrets", a.secrets.Dir())
	}

	retry := backoff.Consul()
	m, rev, err := a.store.Load(ctx)
	for ctx.Err() == nil {
		if err != nil {
			pause := retry.Next(0)
			a.log.Warn("reading the desired state failed; retrying", "err", err, "retry_in", pause)
			if !backoff.Sleep(ctx, pause) {
				return nil
			}
			m, rev, err = a.store.Load(ctx)
			continue
		}
		retry.Reset()
		a.views.Set(nodeview.New(m, a.node.ID))
		a.reconcile(ctx, m)
		if rev, err = a.store.Wait(ctx, rev); err == nil {
			m, rev, err = a.store.Load(ctx)
		}
	}
	return nil
}

// prepareWorkDir makes the work folder one replicas may pass through to
// their own folders, but not list.
func (a *Agent) prepareWorkDir() error {
	if err := os.MkdirAll(a.workDir, 0o711); err != nil {
		return fmt.Errorf("agent work dir: %w", err)
	}
	if err := os.Chmod(a.workDir, 0o711); err != nil {
		return fmt.Errorf("agent work dir: %w", err)
	}
	if abs, err := filepath.Abs(a.workDir); err == nil {
		a.workDir = abs // replicas carry it, to be found by a later incarnation
	}
	passer := a.runAs
	if a.uids.Count > 0 {
		passer = &syscall.Credential{Uid: a.uids.First, Gid: a.uids.First}
	}
	if err := reachable(a.workDir, passer); err != nil {
		return fmt.Errorf("replicas start in their own folders under the work folder, so their user must pass through it: %w; give --work-dir a folder whose parents they may pass through (mode o+x)", err)
	}
	return nil
}

// adoptAll adopts the replicas a previous agent of this node left
// running, kills what it left and nobody adopts, and moves the logs and
// folders of replicas that are gone into previous-run.
func (a *Agent) adoptAll(ctx context.Context) {
	records, dropped := adoptable(a.node.ID, a.workDir)
	if len(dropped) > 0 {
		a.log.Info("replicas a previous agent ran have exited since; they start afresh", "replicas", dropped)
	}
	// The users the running replicas run as are their backends' before
	// any backend is given a new one, so none is given twice.
	for tag, rec := range records {
		if a.users == nil || rec.UID < 0 {
			continue
		}
		if err := a.users.claim(rec.Backend, uint32(rec.UID)); err != nil {
			a.log.Warn("not adopting a replica that runs as a user its backend does not have; it is stopped", "replica", tag, "err", err)
			delete(records, tag)
			_ = removeRecord(a.workDir, wire.ReplicaServiceID(tag))
		}
	}
	for tag, rec := range records {
		r, err := a.adopt(ctx, rec)
		if err != nil {
			a.log.Warn("not adopting a replica a previous agent left running; it is stopped", "replica", tag, "err", err)
			delete(records, tag)
			_ = removeRecord(a.workDir, wire.ReplicaServiceID(tag))
			continue
		}
		a.replicas[tag] = r
	}
	if killed := killLeftovers(a.node.ID, a.workDir, records); len(killed) > 0 {
		a.log.Warn("killed processes a previous agent of this node left running", "pids", killed)
	}
	var keep []string
	for tag := range records {
		sid := wire.ReplicaServiceID(tag)
		keep = append(keep, sid, sid+".log", sid+".log.1", sid+".log.2")
	}
	if err := keepOnlyPreviousRun(a.workDir, keep); err != nil {
		a.log.Warn("the replica logs of earlier runs stay where they are", "dir", a.workDir, "err", err)
	}
}

// exit ends Run: it leaves the replicas running and registered for the
// next agent, or, with StopOnExit, stops them and deregisters the node.
func (a *Agent) exit() {
	if a.stopOnExit {
		a.stopAll()
		_ = a.consul.Agent().ServiceDeregister(wire.AgentServiceID(a.node.ID))
		return
	}
	for tag, r := range a.replicas {
		r.leave()
		delete(a.replicas, tag)
	}
	a.log.Info("agent stopped; its replicas keep running for the next agent to adopt")
}

// reconcile makes the running replicas match this node's placements.
func (a *Agent) reconcile(ctx context.Context, m *meshspec.Model) {
	want := map[string]bool{}
	for _, b := range m.Served() {
		if b.Process == nil {
			continue
		}
		for _, p := range b.Placements {
			if p.Node != a.node.ID {
				continue
			}
			want[p.Tag] = true
			r, running := a.replicas[p.Tag]
			switch {
			case !running && p.State == meshspec.Running:
				if err := a.mayRun(*b.Process); err != nil {
					a.log.Error("refusing to run a command this node does not allow", "replica", p.Tag, "err", err,
						"allowed", a.node.AllowedCommands)
					continue
				}
				r, err := a.startReplica(ctx, b, p)
				if err != nil {
					a.log.Error("could not start replica", "replica", p.Tag, "err", err)
					continue
				}
				a.replicas[p.Tag] = r
			case running && r.adopted && p.State == meshspec.Running && !r.runsFor(b, p):
				r.log.Info("an adopted replica runs another spec than its placement's; replacing it")
				r.stop() // first: the new one takes its registration, record and folder
				delete(a.replicas, p.Tag)
				if r, err := a.startReplica(ctx, b, p); err != nil {
					a.log.Error("could not start replica", "replica", p.Tag, "err", err)
				} else {
					a.replicas[p.Tag] = r
				}
			case running && p.State == meshspec.Draining:
				r.drain(drainStart(p), b.Config.EffectiveGracefulShutdown())
			case running:
				r.setConfig(b.Config.UserConfig) // taken at its next probe
			}
			if r := a.replicas[p.Tag]; r != nil {
				r.adopted = false // checked once, against the first desired state
			}
		}
	}
	for tag, r := range a.replicas {
		if !want[tag] {
			a.background.Go(r.stop) // placement gone: the controller is done with it
			delete(a.replicas, tag)
		}
	}
	a.metrics.replicas.Set(float64(len(a.replicas)))
	a.forgetIdentities()
	a.retireUsers(m)
}

// retireUsers takes back, never to give again, the users of backends that
// are gone from the desired state and have no replica left here: a
// backend deleted and created again runs as a new user.
func (a *Agent) retireUsers(m *meshspec.Model) {
	if a.users == nil {
		return
	}
	keep := map[string]bool{}
	for _, b := range m.Served() {
		keep[b.Name] = true
	}
	for _, r := range a.replicas {
		keep[r.backend] = true
	}
	if err := a.users.retire(keep); err != nil {
		a.log.Warn("backend users", "err", err)
	}
}

// forgetIdentities stops following the identities of backends the node no
// longer runs a replica of.
func (a *Agent) forgetIdentities() {
	if a.secrets == nil {
		return
	}
	running := map[string]bool{}
	for _, r := range a.replicas {
		running[r.backend] = true
	}
	for _, b := range a.secrets.Backends() {
		if !running[b] {
			a.secrets.RemoveBackend(b)
		}
	}
}

func (a *Agent) stopAll() {
	for tag, r := range a.replicas {
		r.stop()
		delete(a.replicas, tag)
	}
}

func (a *Agent) registerNode() error {
	id := wire.AgentServiceID(a.node.ID)
	err := a.consul.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: id, Name: wire.NodeService(a.node.ID), Tags: []string{wire.AgentTag}, Address: a.node.Address, Meta: a.node.Meta(),
		Check: &api.AgentServiceCheck{CheckID: id, Name: "servemesh agent " + a.node.ID, TTL: a.checkTTL.String(),
			Status: api.HealthPassing, DeregisterCriticalServiceAfter: "10m"},
	})
	if err != nil {
		return fmt.Errorf("register node in consul: %w", err)
	}
	return nil
}
