package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/catalog"
	"github.com/servemesh/servemesh/controlplane/model"
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
	mu       sync.Mutex
	cmd      *exec.Cmd
	draining bool
	stopOnce sync.Once
}

// serviceID is the replica's Consul service id; '#' is not URL-safe.
func (r *replica) serviceID() string { return strings.ReplaceAll(r.tag, "#", "-") }
func (r *replica) checkID() string   { return "replica-" + r.serviceID() }
func (r *replica) address() string   { return net.JoinHostPort(r.a.node.Address, strconv.Itoa(r.port)) }

func (a *Agent) startReplica(ctx context.Context, backend string, p model.Placement, spec model.ProcessSpec) (*replica, error) {
	port, err := freePort(ctx, a.node.Address)
	if err != nil {
		return nil, fmt.Errorf("replica %s: find a port: %w", p.Tag, err)
	}
	r := &replica{a: a, backend: backend, tag: p.Tag, spec: spec, port: port, done: make(chan struct{}),
		log: a.log.With("replica", p.Tag)}
	if err := a.consul.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: r.serviceID(), Name: backend, Tags: []string{"servemesh", p.Tag},
		Address: a.node.Address, Port: port,
		Meta: map[string]string{catalog.MetaReplicaTag: p.Tag, catalog.MetaNode: a.node.ID},
		Check: &api.AgentServiceCheck{CheckID: r.checkID(), Name: "servemesh probe of " + p.Tag,
			TTL: a.checkTTL.String(), Status: api.HealthCritical, DeregisterCriticalServiceAfter: "1m"},
	}); err != nil {
		return nil, fmt.Errorf("replica %s: register in consul: %w", p.Tag, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(runCtx)
	go r.probe(runCtx)
	r.log.Info("replica placed here", "backend", backend, "address", r.address())
	return r, nil
}

// run keeps the process running, restarting it with exponential backoff.
func (r *replica) run(ctx context.Context) {
	defer close(r.done)
	backoff := r.a.minBackoff
	for starts := 0; ctx.Err() == nil; starts++ {
		began := time.Now()
		if err := r.startProcess(); err != nil {
			r.log.Error("replica failed to start", "err", err)
		} else {
			err := r.cmd.Wait()
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("replica exited; restarting", "exit", err, "restart_in", backoff)
		}
		r.a.metrics.restarts.WithLabelValues(r.backend, r.tag).Inc()
		if time.Since(began) > time.Minute {
			backoff = r.a.minBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, r.a.maxBackoff)
	}
}

func (r *replica) startProcess() error {
	env := map[string]string{
		"PORT": strconv.Itoa(r.port), "HOST": r.a.node.Address,
		"SERVEMESH_BACKEND": r.backend, "SERVEMESH_REPLICA_TAG": r.tag, "SERVEMESH_NODE": r.a.node.ID,
	}
	expand := func(s string) string { return os.Expand(s, func(k string) string { return env[k] }) }
	for k, v := range r.spec.Env {
		env[k] = expand(v)
	}
	args := make([]string, len(r.spec.Args))
	for i, a := range r.spec.Args {
		args[i] = expand(a)
	}
	logFile, err := os.OpenFile(filepath.Join(r.a.workDir, strings.ReplaceAll(r.tag, "#", "-")+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(r.spec.Command, args...) //nolint:noctx // stopped by stop(), with a drain
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	return nil
}

// probe reports the replica's health to its TTL check every second.
func (r *replica) probe(ctx context.Context) {
	tick := time.NewTicker(r.a.checkTTL / 3)
	defer tick.Stop()
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		status, output := api.HealthPassing, "ok"
		if err := r.check(ctx, client); err != nil {
			status, output = api.HealthCritical, err.Error()
		}
		if err := r.a.consul.Agent().UpdateTTL(r.checkID(), output, status); err != nil && ctx.Err() == nil {
			r.log.Warn("could not report replica health", "err", err)
		}
	}
}

func (r *replica) check(ctx context.Context, client *http.Client) error {
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
	resp, err := client.Do(req)
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
	r.cancel()
	r.mu.Lock()
	cmd := r.cmd
	r.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(r.a.stopGrace):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
	}
	if err := r.a.consul.Agent().ServiceDeregister(r.serviceID()); err != nil {
		r.log.Warn("deregister replica", "err", err)
	}
	r.log.Info("replica stopped")
}

func freePort(ctx context.Context, host string) (int, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
