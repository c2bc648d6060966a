package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/heartbeat"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/wire"
)

// replica runs one placed replica: its process, its registration in Consul
// and its health probe.
type replica struct {
	a       *Agent
	backend string
	tag     string
	spec    model.ProcessSpec
	port    int
	log     *slog.Logger

	cancel   context.CancelFunc // ends the run loop
	done     chan struct{}
	output   *lumberjack.Logger // the replica's log, rotated
	mu       sync.Mutex
	draining bool
	stopOnce sync.Once
}

// serviceID is the replica's Consul service id; '#' is not URL-safe.
func (r *replica) serviceID() string { return wire.ReplicaServiceID(r.tag) }
func (r *replica) checkID() string   { return "replica-" + r.serviceID() }
func (r *replica) address() string   { return net.JoinHostPort(r.a.listenHost, strconv.Itoa(r.port)) }

func (a *Agent) startReplica(ctx context.Context, backend string, p model.Placement, spec model.ProcessSpec) (*replica, error) {
	if a.secrets != nil { // its node's inbound listener presents this identity
		if err := a.secrets.AddBackend(ctx, backend); err != nil {
			return nil, fmt.Errorf("replica %s: %w", p.Tag, err)
		}
	}
	addr, err := proc.FreeAddr(ctx, a.listenHost)
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", p.Tag, err)
	}
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	r := &replica{a: a, backend: backend, tag: p.Tag, spec: spec, port: port, done: make(chan struct{}),
		log: a.log.With("replica", p.Tag), output: &lumberjack.Logger{
			Filename: filepath.Join(a.workDir, wire.ReplicaServiceID(p.Tag)+".log"),
			MaxSize:  a.logMaxMB, MaxBackups: 2,
		}}
	meta := map[string]string{wire.MetaReplicaTag: p.Tag, wire.MetaReplicaNode: a.node.ID}
	if a.inbound != "" {
		meta[wire.MetaReplicaInbound] = a.inbound
	}
	if err := a.consul.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: r.serviceID(), Name: backend, Tags: []string{wire.ReplicaServiceTag, p.Tag},
		Address: a.listenHost, Port: port, Meta: meta,
		Check: &api.AgentServiceCheck{CheckID: r.checkID(), Name: "servemesh probe of " + p.Tag,
			TTL: a.checkTTL.String(), Status: api.HealthCritical, DeregisterCriticalServiceAfter: "1m"},
	}); err != nil {
		return nil, fmt.Errorf("replica %s: register in consul: %w", p.Tag, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(runCtx)
	go heartbeat.Run(runCtx, a.consul.Agent(), r.checkID(), a.checkTTL/3, r.probe, r.log)
	r.log.Info("replica placed here", "backend", backend, "address", r.address())
	return r, nil
}

// run keeps the process running, restarting it with exponential backoff.
func (r *replica) run(ctx context.Context) {
	defer close(r.done)
	backoff := proc.Backoff{Min: r.a.minBackoff, Max: r.a.maxBackoff, ResetAfter: time.Minute}
	for ctx.Err() == nil {
		began := time.Now()
		child, err := r.startProcess()
		if err == nil {
			select {
			case <-ctx.Done(): // stopping: SIGTERM, then SIGKILL after the grace
				_ = child.Stop(r.a.stopGrace)
				return
			case <-child.Done():
				err = child.Wait()
			}
		}
		if ctx.Err() != nil {
			return
		}
		delay := backoff.Next(time.Since(began))
		r.log.Warn("replica exited or failed to start; restarting", "err", err, "restart_in", delay)
		r.a.metrics.restarts.WithLabelValues(r.backend, r.tag).Inc()
		if !proc.Sleep(ctx, delay) {
			return
		}
	}
}

// defaultPath is a replica's PATH when its backend sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// environment is a replica's whole environment: PATH, what its backend
// sets, and servemesh's own variables (which win). Nothing of the agent's
// own environment reaches it: no CONSUL_HTTP_TOKEN, no other secret. In
// the backend's values and arguments, ${PORT}, ${HOST} and servemesh's
// variables expand; anything else is left as written.
func (r *replica) environment() (env map[string]string, expand func(string) string) {
	own := map[string]string{
		"PORT": strconv.Itoa(r.port), "HOST": r.a.listenHost,
		"SERVEMESH_BACKEND": r.backend, "SERVEMESH_REPLICA_TAG": r.tag, "SERVEMESH_NODE": r.a.node.ID,
		"SERVEMESH_AGENT_DIR": r.a.workDir,
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
	for k, v := range r.spec.Env {
		env[k] = expand(v)
	}
	for k, v := range own {
		env[k] = v
	}
	return env, expand
}

func (r *replica) startProcess() (*proc.Process, error) {
	env, expand := r.environment()
	args := make([]string, len(r.spec.Args))
	for i, a := range r.spec.Args {
		args[i] = expand(a)
	}
	environ := make([]string, 0, len(env))
	for _, k := range model.SortedKeys(env) {
		environ = append(environ, k+"="+env[k])
	}
	child, err := proc.Start(proc.Spec{Path: r.spec.Command, Args: args, Env: environ, Stdout: r.output, Stderr: r.output,
		Credential: r.a.runAs})
	if err != nil {
		return nil, err
	}
	return child, nil
}

// probeClient checks replicas' health paths.
var probeClient = &http.Client{Timeout: time.Second}

// probe checks the replica for its TTL check's next beat.
func (r *replica) probe(ctx context.Context) (status, output string) {
	if err := r.check(ctx); err != nil {
		return api.HealthCritical, err.Error()
	}
	return api.HealthPassing, "ok"
}

func (r *replica) check(ctx context.Context) error {
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

// drain lets in-flight requests finish (Envoy already sends no new ones to a
// draining replica), then stops the replica.
func (r *replica) drain() {
	r.mu.Lock()
	if r.draining {
		r.mu.Unlock()
		return
	}
	r.draining = true
	r.mu.Unlock()
	r.log.Info("replica draining", "for", r.a.drainGrace)
	go func() {
		time.Sleep(r.a.drainGrace)
		r.stop()
	}()
}

// stop ends the replica: SIGTERM, SIGKILL after the stop grace, then
// deregistration. It returns when the process is gone.
func (r *replica) stop() { r.stopOnce.Do(r.stopNow) }

func (r *replica) stopNow() {
	r.cancel() // run stops the process
	<-r.done
	_ = r.output.Close()
	if err := r.a.consul.Agent().ServiceDeregister(r.serviceID()); err != nil {
		r.log.Warn("deregister replica", "err", err)
	}
	r.log.Info("replica stopped")
}
