package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/heartbeat"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// replica runs one placed replica: its process, its registration in Consul
// and its health probe.
type replica struct {
	a       *Agent
	backend string
	tag     string
	spec    meshspec.ProcessSpec
	grpc    bool // probed with the gRPC health service (no health path)
	// port is where its process listens, on the agent's listen host: it
	// moves when another socket holds it (movePortIfTaken), read by the probe,
	// the picker and reconfigure while the run loop may move it.
	port atomic.Int32
	log  *slog.Logger

	cancel   context.CancelFunc // ends the run loop
	done     chan struct{}
	output   replicaLog
	mu       sync.Mutex
	draining bool
	stopOnce sync.Once
	// leaving, when the run loop ends, leaves the process running for
	// the next agent to adopt (leave), rather than stopping it (stop).
	leaving          atomic.Bool
	wants            map[string]int // devices it needs of each resource
	config           atomic.Pointer[meshspec.UserConfig]
	devices          map[string][]int // its devices of each resource, by index; set by run
	specHash         string           // meshspec.SpecHash of what its process runs
	reconfigureToken string           // what it takes user_config with (wire.ReconfigureTokenEnv)
	uid              int              // the user its process runs as
	// adopted replicas were started by an earlier agent; reconcile checks
	// once that they run what their placement wants.
	adopted  bool
	restarts atomic.Int64 // exits in a row
	// lastExit is why its process last exited (exitNote), kept in its
	// registration when it registers again at a new port.
	lastExit atomic.Pointer[string]
	process  atomic.Pointer[proc.Identity]
	owned    atomic.Pointer[ownedPort] // its port, found its process's own (portowner.go)
}

// serviceID is the replica's Consul service id; '#' is not URL-safe.
func (r *replica) serviceID() string { return wire.ReplicaServiceID(r.tag) }
func (r *replica) checkID() string   { return "replica-" + r.serviceID() }
func (r *replica) address() string {
	return net.JoinHostPort(r.a.listenHost, strconv.Itoa(r.portNow()))
}
func (r *replica) portNow() int { return int(r.port.Load()) }

func (a *Agent) startReplica(ctx context.Context, b meshspec.Backend, p meshspec.Placement) (*replica, error) {
	if a.secrets != nil { // its node's inbound listener presents this identity
		if err := a.secrets.AddBackend(ctx, b.Name); err != nil {
			return nil, fmt.Errorf("replica %s: %w", p.Tag, err)
		}
	}
	addr, err := proc.FreeAddr(ctx, a.listenHost)
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", p.Tag, err)
	}
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	r := a.newReplica(b.Name, p.Tag, *b.Process, b.Protocol == meshspec.ProtocolGRPC && b.Process.HealthPath == "", port)
	r.specHash = meshspec.SpecHash(b.Process)
	r.wants = b.Config.Resources
	r.setConfig(b.Config.UserConfig)
	if err := r.register("", 0, api.HealthCritical); err != nil {
		return nil, fmt.Errorf("replica %s: register in consul: %w", p.Tag, err)
	}
	r.watch(nil)
	r.log.Info("replica placed here", "backend", b.Name, "address", r.address())
	return r, nil
}

func (a *Agent) newReplica(backend, tag string, spec meshspec.ProcessSpec, grpc bool, port int) *replica {
	r := &replica{a: a, backend: backend, tag: tag, spec: spec, grpc: grpc, done: make(chan struct{}),
		reconfigureToken: rand.Text(),
		log:              a.log.With("replica", tag), output: replicaLog{
			path:     filepath.Join(a.workDir, wire.ReplicaServiceID(tag)+".log"),
			maxBytes: int64(a.logMaxMB) << 20, backups: 2,
		}}
	r.port.Store(int32(port))
	return r
}

// watch starts the replica's run loop (on child, if adopted) and its
// health probe.
func (r *replica) watch(child *proc.Process) {
	runCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.a.picker.Track(r.tag, r.backend, r.address())
	if r.adopted {
		r.a.picker.Resume(r.tag) // its cache outlived the last agent
	}
	go r.run(runCtx, child)
	go heartbeat.RunProbing(runCtx, r.a.consul.Agent(), r.checkID(), r.a.checkTTL/3, startupProbe, r.probe, r.log)
}

// takeDevices gets the replica its devices before its process first
// starts, waiting while a replica that is stopping still holds them; false
// if ctx ended first.
func (r *replica) takeDevices(ctx context.Context) bool {
	for logged := false; ; logged = true {
		got, err := r.a.devices.take(r.tag, r.wants)
		if err == nil {
			r.mu.Lock()
			r.devices = got
			r.mu.Unlock()
			if len(got) > 0 {
				r.log.Info("replica's devices", "devices", got)
			}
			return true
		}
		if !logged {
			r.log.Info("waiting for devices a stopping replica still holds", "err", err)
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return false
		}
	}
}

// register registers the replica in Consul's catalog with its check at
// status (critical until its probe passes, for a new replica); exit, if
// not empty, says why its process last exited, and restarts how many
// times it did.
func (r *replica) register(exit string, restarts int, status string) error {
	meta := map[string]string{wire.MetaReplicaTag: r.tag, wire.MetaReplicaNode: r.a.node.ID}
	if restarts > 0 {
		meta[wire.MetaReplicaRestarts] = strconv.Itoa(restarts)
	}
	if r.a.inbound != "" {
		meta[wire.MetaReplicaInbound] = r.a.inbound
	}
	return r.a.consul.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: r.serviceID(), Name: wire.BackendService(r.backend), Tags: []string{wire.ReplicaServiceTag, r.tag},
		Address: r.a.listenHost, Port: r.portNow(), Meta: meta,
		Check: &api.AgentServiceCheck{CheckID: r.checkID(), Name: "servemesh probe of " + r.tag, Notes: truncate(exit, wire.MaxExitNote),
			TTL: r.a.checkTTL.String(), Status: status, DeregisterCriticalServiceAfter: "1m"},
	})
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-3]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// run keeps the process running (child, if adopted, first), restarting
// it with exponential backoff, and rotates its log. When ctx ends it stops
// the process, unless the replica is leaving (see leave).
func (r *replica) run(ctx context.Context, child *proc.Process) {
	defer close(r.done)
	if child == nil && !r.takeDevices(ctx) {
		return
	}
	defer func() {
		if !r.leaving.Load() {
			r.a.state.configs.Delete(r.tag)
			r.a.devices.release(r.tag) // stopped for good
		}
	}()
	restart := backoff.Backoff{Min: r.a.minBackoff, Max: r.a.maxBackoff, ResetAfter: time.Minute}
	rotate := time.NewTicker(logRotateEvery)
	defer rotate.Stop()
	for ctx.Err() == nil {
		began := time.Now()
		var err error
		if child == nil {
			r.movePortIfTaken(ctx, int(r.restarts.Load()))
			child, err = r.startProcess()
		}
		for err == nil && child != nil {
			select {
			case <-ctx.Done():
				if !r.leaving.Load() { // stopping: SIGTERM, then SIGKILL after the grace
					_ = child.Stop(r.a.stopGrace)
				}
				return
			case <-child.Done():
				err = child.Wait()
				child = nil
			case <-rotate.C:
				if rerr := r.output.rotate(); rerr != nil {
					r.log.Warn("could not rotate the replica's log", "err", rerr)
				}
			}
		}
		child = nil
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) >= time.Minute {
			r.restarts.Store(0) // it ran a while: a crash loop counts exits in a row
		}
		r.exited(err, int(r.restarts.Add(1)))
		delay := restart.Next(time.Since(began))
		r.log.Warn("replica exited or failed to start; restarting", "err", err, "restart_in", delay)
		r.a.metrics.restarts.WithLabelValues(r.backend, r.tag).Inc()
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

// movePortIfTaken moves the replica to a free port when another socket
// holds its own, before its process starts: a port is chosen once
// (proc.FreeAddr), and another program may take it while the replica is
// down; its process would then fail to listen at every start, for ever. The
// replica registers again at its new port (critical until its probe
// passes, with why it last exited), and the node's picker follows it.
// exits is how many times in a row it exited, for its registration.
func (r *replica) movePortIfTaken(ctx context.Context, exits int) {
	from, err := r.moveIfTaken(ctx)
	if from == 0 {
		return
	}
	if err != nil {
		r.log.Warn("the replica's port is taken and no other is free; starting it anyway", "port", from, "err", err)
		return
	}
	r.log.Warn("the replica's port is taken; it moves to another", "from", from, "to", r.portNow())
	r.a.picker.Track(r.tag, r.backend, r.address())
	var note string
	if last := r.lastExit.Load(); last != nil {
		note = *last
	}
	if err := r.register(note, exits, api.HealthCritical); err != nil {
		r.log.Warn("could not register the replica at its new port; its next exit will", "err", err)
	}
}

// moveIfTaken gives the replica a free port if another socket holds its
// own: from is the port it held (0 if it was free, or could not be
// told), err why it could not move.
func (r *replica) moveIfTaken(ctx context.Context) (from int, err error) {
	var inUse *proc.InUseError
	if err := proc.CheckFree(ctx, "replica "+r.tag+"'s port", r.address()); !errors.As(err, &inUse) {
		return 0, nil // free, or a fault its process will report
	}
	from = r.portNow()
	addr, err := proc.FreeAddr(ctx, r.a.listenHost)
	if err != nil {
		return from, err
	}
	_, portText, _ := net.SplitHostPort(addr)
	port, err := strconv.Atoi(portText)
	if err != nil {
		return from, fmt.Errorf("a free port: %w", err)
	}
	r.port.Store(int32(port))
	return from, nil
}

// logRotateEvery is how often a replica's log is checked against its cap
// (the kubelet checks containers' logs every 10 s).
const logRotateEvery = time.Second

// exited takes the replica out of rotation now, not at its next probe
// (the node's Envoy then holds its requests in the activator instead of
// trying a dead port): critical at once (a status change, which Consul
// syncs first), then registered again with why in its check's notes (see
// wire.MaxExitNote). Its next process takes its config again.
func (r *replica) exited(err error, exits int) {
	r.a.picker.SetReady(r.tag, false)
	note := r.exitNote(err, exits)
	r.lastExit.Store(&note)
	if uerr := r.a.consul.Agent().UpdateTTL(r.checkID(), note, api.HealthCritical); uerr != nil {
		r.log.Warn("could not mark the exited replica critical; its next probe will", "err", uerr)
	}
	if uerr := r.register(note, exits, api.HealthCritical); uerr != nil {
		r.log.Warn("could not say why the replica exited in its registration", "err", uerr)
	}
	r.a.state.configs.Delete(r.tag)
}

// exitNoteLines are the lines of its log a replica's exit note quotes.
const exitNoteLines = 5

// exitNote says, in the check notes of a replica whose process exited, why, how
// many times so far (after wire.ExitedNote), and the last lines of its log, for
// whoever waits for it (backend create --wait).
func (r *replica) exitNote(err error, exits int) string {
	tail := strings.TrimRight(proc.LogTail(r.output.path, 1024), "\n")
	lines := strings.Split(tail, "\n")
	if len(lines) > exitNoteLines {
		lines = lines[len(lines)-exitNoteLines:]
	}
	return fmt.Sprintf("%s %d times; the last: %v%s%s", wire.ExitedNote, exits, err, wire.LogTailNote, strings.Join(lines, " | "))
}

// defaultPath is a replica's PATH when its backend sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// environment is a replica's whole environment: PATH, what its backend
// sets, and servemesh's own variables (which win). Nothing of the agent's
// own environment reaches it: no CONSUL_HTTP_TOKEN, no other secret, not
// even where the agent works. In
// the backend's values and arguments, ${PORT}, ${HOST} and servemesh's
// variables expand; anything else is left as written.
func (r *replica) environment() (env map[string]string, expand func(string) string) {
	own := map[string]string{
		"PORT": strconv.Itoa(r.portNow()), "HOST": r.a.listenHost,
		"SERVEMESH_BACKEND": r.backend, "SERVEMESH_REPLICA_TAG": r.tag, "SERVEMESH_NODE": r.a.node.ID,
		wire.ReconfigureTokenEnv: r.reconfigureToken,
		agentMarkVar:             agentMark(r.a.node.ID, r.a.workDir),
	}
	if r.a.meshListener != "" {
		own[wire.MeshListenerEnv] = r.a.meshListener
	}
	expand = func(s string) string {
		return os.Expand(s, func(k string) string {
			if v, ok := own[k]; ok {
				return v
			}
			return "${" + k + "}"
		})
	}
	env = map[string]string{"PATH": defaultPath}
	for k, v := range tracingEnv(r.a.Desired(), r.backend, r.spec.Env) {
		env[k] = v
	}
	for k, v := range r.spec.Env {
		env[k] = expand(v)
	}
	for k, v := range deviceEnv(r.devices) {
		env[k] = v
	}
	for k, v := range own {
		env[k] = v
	}
	return env, expand
}

// tracingEnv tells a replica of backend where the mesh's traces go, in
// the OpenTelemetry SDK's own variables (the Python runtime and any SDK
// read them): the collector and the backend as the service's name, as
// the desired state m says when the replica starts (a replica started
// before a new collector keeps the old one until it restarts). None if
// the mesh traces nothing, or if the backend's own env names an OTLP
// endpoint or turns the SDK off: what the operator wrote wins.
func tracingEnv(m *meshspec.Model, backend string, own map[string]string) map[string]string {
	if m == nil || m.Mesh == nil || m.Mesh.Tracing == nil || m.Mesh.Tracing.Collector == "" {
		return nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"} {
		if _, set := own[k]; set {
			return nil
		}
	}
	return map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + m.Mesh.Tracing.Collector,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_SERVICE_NAME":           backend,
	}
}

// startProcess starts the replica's process, detached so that it outlives
// the agent, and records it for the next agent to adopt.
func (r *replica) startProcess() (*proc.Process, error) {
	env, expand := r.environment()
	args := make([]string, len(r.spec.Args))
	for i, a := range r.spec.Args {
		args[i] = expand(a)
	}
	environ := make([]string, 0, len(env))
	for _, k := range meshspec.SortedKeys(env) {
		environ = append(environ, k+"="+env[k])
	}
	cred, err := r.a.credential(r.backend)
	if err != nil {
		return nil, err
	}
	dir, err := r.folder(cred)
	if err != nil {
		return nil, err
	}
	out, err := r.output.open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = out.Close() }() // the process holds its own
	child, err := proc.Start(proc.Spec{Path: r.spec.Command, Args: args, Env: environ, Stdout: out, Stderr: out,
		Dir: dir, Credential: cred, Detached: true})
	if err != nil {
		return nil, err
	}
	r.uid = os.Geteuid()
	if cred != nil {
		r.uid = int(cred.Uid)
	}
	id := child.Identity()
	r.process.Store(&id)
	r.writeRecord()
	return child, nil
}

// writeRecord writes down the replica's process for the next agent.
func (r *replica) writeRecord() {
	id := r.process.Load()
	if id == nil {
		return
	}
	uid := r.uid
	version, _ := r.a.state.configs.Load(r.tag)
	config, _ := version.(string)
	r.mu.Lock()
	devices := r.devices
	r.mu.Unlock()
	rec := replicaRecord{Tag: r.tag, Backend: r.backend, Process: *id, Host: r.a.listenHost, Port: r.portNow(), Spec: r.specHash, UID: uid,
		ProcessSpec: r.spec, GRPC: r.grpc, Config: config, ReconfigureToken: r.reconfigureToken, Devices: devices, Restarts: int(r.restarts.Load())}
	if err := writeRecord(r.a.workDir, r.serviceID(), rec); err != nil {
		r.log.Warn("the next agent will not adopt this replica", "err", err)
	}
}

// folder is where the replica starts: a folder of its own in the agent's
// work folder (which replicas may pass through but not list), which only
// its user may enter (0700, owned by c, the user it runs as); never a
// folder of the agent's own, where Envoy's admin socket and the node's keys
// are.
func (r *replica) folder(c *syscall.Credential) (string, error) {
	dir := filepath.Join(r.a.workDir, r.serviceID())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("the replica's folder: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("the replica's folder: %w", err)
	}
	if c != nil {
		if err := os.Chown(dir, int(c.Uid), int(c.Gid)); err != nil {
			return "", fmt.Errorf("the replica's folder for user %d: %w", c.Uid, err)
		}
	}
	return dir, nil
}

// startupProbe is how often a replica that is not ready yet (starting,
// restarting, failing) is probed: it is served, and its held requests
// released, this soon after it is ready.
const startupProbe = 100 * time.Millisecond

// probeClient checks replicas' health paths.
var probeClient = &http.Client{Timeout: time.Second, CheckRedirect: httpserver.NoRedirects}

// probe checks the replica for its TTL check's next beat.
func (r *replica) probe(ctx context.Context) (status, output string) {
	status, output = r.readiness(ctx)
	r.mu.Lock()
	serving := status == api.HealthPassing && !r.draining
	r.mu.Unlock()
	r.a.picker.SetReady(r.tag, serving)
	return status, output
}

func (r *replica) readiness(ctx context.Context) (status, output string) {
	if err := r.ownsPort(false); err != nil {
		return api.HealthCritical, err.Error()
	}
	if err := r.check(ctx); err != nil {
		return api.HealthCritical, err.Error()
	}
	if err := r.reconfigure(ctx); err != nil {
		return api.HealthCritical, err.Error()
	}
	return api.HealthPassing, wire.ReplicaReadyOutput
}

func (r *replica) check(ctx context.Context) error {
	if r.grpc {
		return grpcHealthy(ctx, r.address())
	}
	if r.spec.HealthPath == "" {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", r.address())
		if err != nil {
			return err
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.address()+r.spec.HealthPath, nil)
	if err != nil {
		return err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s answered %d", r.spec.HealthPath, resp.StatusCode)
	}
	return nil
}

// drain takes the replica out of the picker's rotation (Envoy already
// sends it no new request) and stops it once it has served its requests
// in flight, from since and within bound (awaitDrained).
func (r *replica) drain(since time.Time, bound time.Duration) {
	r.mu.Lock()
	if r.draining {
		r.mu.Unlock()
		return
	}
	r.draining = true
	r.mu.Unlock()
	r.a.picker.SetReady(r.tag, false)
	r.log.Info("replica draining: it stops once its requests in flight have ended", "since", since.Format(time.RFC3339), "at_most", bound)
	done := context.Background().Done()
	if r.a.runCtx != nil {
		done = r.a.runCtx.Done()
	}
	r.a.background.Go(func() { r.awaitDrained(done, since, bound) })
}

// stop ends the replica: SIGTERM, SIGKILL after the stop grace, then
// deregistration. It returns when the process is gone.
func (r *replica) stop() { r.stopOnce.Do(r.stopNow) }

func (r *replica) stopNow() {
	r.a.picker.Forget(r.tag)
	r.cancel() // run stops the process
	<-r.done
	if err := removeRecord(r.a.workDir, r.serviceID()); err != nil {
		r.log.Warn("stopped replica", "err", err)
	}
	if err := r.a.consul.Agent().ServiceDeregister(r.serviceID()); err != nil {
		r.log.Warn("deregister replica", "err", err)
	}
	r.log.Info("replica stopped")
}

// leave stops watching the replica but leaves its process running and
// registered, for the next agent to adopt; it returns when the run loop
// is done.
func (r *replica) leave() {
	r.stopOnce.Do(func() {
		r.leaving.Store(true)
		r.cancel()
		<-r.done
	})
}

// reachable says why a process run as cred could not pass through dir and
// its parents into a folder of its own below it, or returns nil (always,
// for the agent's own user).
func reachable(dir string, cred *syscall.Credential) error {
	if cred == nil || cred.Uid == 0 {
		return nil
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("folder %s: %w", d, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		switch {
		case !ok:
		case st.Uid == cred.Uid:
			ok = mode&0o100 != 0
		case st.Gid == cred.Gid || slices.Contains(cred.Groups, st.Gid):
			ok = mode&0o010 != 0
		default:
			ok = mode&0o001 != 0
		}
		if !ok {
			return fmt.Errorf("user %d may not pass through %s (mode %v)", cred.Uid, d, mode)
		}
		if parent := filepath.Dir(d); parent == d {
			return nil
		}
	}
}

// mayRun says why this node refuses to run spec, or returns nil: its
// command, and where the command's symlinks lead, must both be allowed
// (--allow-command), and it may set no variable that loads other code
// (meshspec.LoaderVariable). The controller checks the same before placing,
// but only the node sees its own files.
func (a *Agent) mayRun(spec meshspec.ProcessSpec) error {
	if !a.node.Allows(spec.Command) {
		return fmt.Errorf("command %q is not allowed here", spec.Command)
	}
	resolved, err := filepath.EvalSymlinks(spec.Command)
	if err != nil {
		return fmt.Errorf("command %q: %w", spec.Command, err)
	}
	if !a.node.Allows(resolved) {
		return fmt.Errorf("command %q leads to %q, which is not allowed here", spec.Command, resolved)
	}
	for k := range spec.Env {
		if meshspec.LoaderVariable(k) {
			return fmt.Errorf("variable %s would load code the command does not name", k)
		}
	}
	return nil
}
