package ratelimit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/toolpath"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// RedisTimeout bounds the service's wait for Redis: while Redis is down
// or unreachable, a request of a limited endpoint waits this long for the
// service's error, then its failure mode holds (below Envoy's
// translate.RateLimitTimeout, so the service, not Envoy, gives up first).
const RedisTimeout = 200 * time.Millisecond

// Options configure a node's rate limit service.
type Options struct {
	// Binary is envoyproxy/ratelimit's service.
	Binary string
	// Redis is the store every node's service shares, host:port; Password,
	// if set, is its AUTH password.
	Redis, Password string
	// Dir is the node's Envoy's folder: the service listens there
	// (wire.RateLimitSocket) and keeps its configuration, record and log
	// in its ratelimit folder.
	Dir string
	// Desired is the desired state the agent last read (nil: none yet).
	Desired func() *meshspec.Model
	Logger  *slog.Logger
	// StopOnExit stops the service when Run returns; otherwise it is left
	// serving, for the next agent to adopt.
	StopOnExit bool
}

// Service is a node's rate limit service.
type Service struct {
	o   Options
	dir string

	mu      sync.Mutex
	child   *proc.Process
	metrics string // where its metrics are, 127.0.0.1:port

	model  *meshspec.Model // the desired state its config was last rendered from
	config []byte

	// What the service has loaded: written is the desired state the file
	// was last rendered from, loadsBefore the service's count of loads
	// just before it was written (0 for a service started since, which
	// loads it at start), and loaded the state of the last file it is
	// known to have loaded.
	written, loaded *meshspec.Model
	loadsBefore     float64
}

// record is what an agent writes down of the service it started, for the
// next agent to adopt it (JSON; fields may be added).
type record struct {
	Process  proc.Identity `json:"process"`
	Settings string        `json:"settings"`
	Metrics  string        `json:"metrics"`
}

// New checks o; Run starts the service.
func New(o Options) (*Service, error) {
	if o.Binary == "" || o.Redis == "" || o.Dir == "" || o.Desired == nil || o.Logger == nil {
		return nil, errors.New("rate limit service: binary, redis, folder, desired state and logger are required")
	}
	// The service runs in its own folder, so every path it is given is
	// absolute: a relative --work-dir once pointed it at a config folder
	// below its own, and it exited at start-up forever.
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("rate limit service: folder: %w", err)
	}
	o.Dir = dir
	return &Service{o: o, dir: filepath.Join(dir, "ratelimit")}, nil
}

func (s *Service) configDir() string  { return filepath.Join(s.dir, "runtime", "current", "config") }
func (s *Service) recordPath() string { return filepath.Join(s.dir, "process.json") }
func (s *Service) socket() string     { return filepath.Join(s.o.Dir, wire.RateLimitSocket) }

// Run keeps the service running and its configuration following the
// desired state until ctx ends.
//
// Its folder is made here, not in New: the work folder is the Envoy's,
// whose supervisor makes it first, with the mode replicas need to reach
// it (MkdirAll would make it the agent's alone).
func (s *Service) Run(ctx context.Context) error {
	if err := os.MkdirAll(s.configDir(), 0o700); err != nil {
		return fmt.Errorf("rate limit service: %w", err)
	}
	if err := s.follow(ctx); err != nil {
		return err
	}
	if s.adoptOrStart(ctx) {
		// What the adopted service loaded is not known: it loads the file
		// again, and counts it.
		s.config = nil
		if err := s.follow(ctx); err != nil {
			return err
		}
	}
	restart := backoff.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second, ResetAfter: time.Minute}
	started := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		s.mu.Lock()
		child := s.child
		s.mu.Unlock()
		var done <-chan struct{}
		if child != nil {
			done = child.Done()
		}
		select {
		case <-ctx.Done():
			s.exit()
			return nil
		case <-tick.C:
			if err := s.follow(ctx); err != nil {
				s.o.Logger.Error("rate limit service: configuration not written; it keeps the last", "err", err)
			}
			if child == nil {
				s.start(ctx)
			}
		case <-done:
			pause := restart.Next(time.Since(started))
			s.o.Logger.Warn("rate limit service exited; starting it again", "err", child.Wait(), "in", pause,
				"log", proc.LogTail(s.logPath(), 2048))
			if !backoff.Sleep(ctx, pause) {
				s.exit()
				return nil
			}
			started = time.Now()
			s.start(ctx)
		}
	}
}

// follow writes the configuration for the desired state, if it changed;
// the service reloads it.
func (s *Service) follow(ctx context.Context) error {
	m := s.o.Desired()
	if m == s.model && s.config != nil {
		return nil
	}
	config, err := Config(m)
	if err != nil {
		return err
	}
	s.model = m
	if bytes.Equal(config, s.config) {
		s.mu.Lock()
		if s.written != nil && s.written != m && s.loaded == s.written {
			s.loaded = m // the same limits: what it loaded serves m too
		}
		s.written = m
		s.mu.Unlock()
		return nil
	}
	// None runs, or one is starting (its metrics not up yet): it loads
	// the file at start, its first load.
	before := 0.0
	if families, err := s.readMetrics(ctx); err == nil {
		before = configLoads(families)
	}
	if err := envoy.ReplaceFile(filepath.Join(s.configDir(), "servemesh.yaml"), config); err != nil {
		return fmt.Errorf("rate limit service: %w", err)
	}
	s.config = config
	s.mu.Lock()
	s.written, s.loadsBefore = m, before
	s.mu.Unlock()
	return nil
}

// loadedLimits is the limits the service counts, by endpoint, now that its
// count of loads is loads.
func (s *Service) loadedLimits(loads float64) map[string]string {
	s.mu.Lock()
	if loads > s.loadsBefore {
		s.loaded = s.written
	}
	m := s.loaded
	s.mu.Unlock()
	out := map[string]string{}
	if m != nil {
		for _, e := range m.Endpoints {
			if limits := e.CountedLimits(); limits != "" {
				out[e.Name] = limits
			}
		}
	}
	return out
}

// adoptOrStart adopts the service an earlier agent left, if it runs with
// these settings, or starts one (stopping one with other settings); it
// reports whether it adopted one.
func (s *Service) adoptOrStart(ctx context.Context) bool {
	if rec, err := s.readRecord(); err == nil {
		if p, err := proc.Adopt(rec.Process); err == nil {
			if rec.Settings == s.settings() {
				s.mu.Lock()
				s.child, s.metrics = p, rec.Metrics
				s.mu.Unlock()
				s.o.Logger.Info("rate limit service adopted", "pid", rec.Process.Pid)
				return true
			}
			s.o.Logger.Info("rate limit service runs with other settings; replacing it", "pid", rec.Process.Pid)
			_ = p.Stop(5 * time.Second)
		}
	}
	s.start(ctx)
	return false
}

// start starts the service; a failure is logged and retried by Run.
func (s *Service) start(ctx context.Context) {
	metrics, err := proc.FreeAddr(ctx, "127.0.0.1")
	if err != nil {
		s.o.Logger.Error("rate limit service: no port for its metrics", "err", err)
		return
	}
	_ = os.Remove(s.socket()) // a stale socket file stops it listening
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.o.Logger.Error("rate limit service: log", "err", err)
		return
	}
	defer func() { _ = log.Close() }()
	child, err := proc.Start(proc.Spec{Path: s.o.Binary, Env: s.environ(metrics), Dir: s.dir, Stdout: log, Stderr: log, Detached: true})
	if err != nil {
		s.o.Logger.Error("rate limit service: start", "err", err)
		return
	}
	s.mu.Lock()
	s.child, s.metrics = child, metrics
	s.loadsBefore = 0 // it loads the file there is at start
	s.mu.Unlock()
	if err := s.writeRecord(record{Process: child.Identity(), Settings: s.settings(), Metrics: metrics}); err != nil {
		s.o.Logger.Error("rate limit service: record not written; the next agent will start another", "err", err)
	}
	s.o.Logger.Info("rate limit service started", "pid", child.Pid(), "socket", s.socket(), "redis", s.o.Redis, "log", s.logPath())
}

// exit leaves the service serving for the next agent, or stops it.
func (s *Service) exit() {
	s.mu.Lock()
	child := s.child
	s.mu.Unlock()
	if child == nil || !s.o.StopOnExit {
		return
	}
	_ = child.Stop(5 * time.Second)
	_ = os.Remove(s.recordPath())
}

func (s *Service) logPath() string { return filepath.Join(s.dir, "service.log") }

// environ is the service's whole environment (none of the agent's: its
// Consul token stays with it). servemesh's build (tools/ratelimit) serves
// its API on the unix socket alone, a file only its user may connect to,
// and its metrics on loopback; the HTTP and debug listeners upstream's
// build opens beside them (whose /json answers anyone) are pinned to
// loopback here in case the binary is upstream's.
func (s *Service) environ(metrics string) []string {
	env := []string{
		"GRPC_UDS=" + s.socket(),
		"HOST=127.0.0.1", "PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
		"CONFIG_TYPE=FILE",
		"RUNTIME_ROOT=" + filepath.Join(s.dir, "runtime"), "RUNTIME_SUBDIRECTORY=current", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + s.o.Redis, "REDIS_TIMEOUT=" + RedisTimeout.String(),
		"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + metrics, "STATS_FLUSH_INTERVAL=1s",
		"LOG_LEVEL=warn", "LOG_FORMAT=json",
		// Its answers say which descriptors a quota in shadow mode would
		// have refused (wire.ShadowedKey).
		"RESPONSE_DYNAMIC_METADATA=true",
	}
	if s.o.Password != "" {
		env = append(env, "REDIS_AUTH="+s.o.Password)
	}
	return env
}

// settings identifies what the service runs with, the password by its
// hash, and its binary by its size and modification time: a record with
// others is of a service to replace (so a rebuilt binary, say one that
// closes a listener, replaces the service that an agent adopts).
func (s *Service) settings() string {
	binary := s.o.Binary
	if fi, err := os.Stat(s.o.Binary); err == nil {
		binary = fmt.Sprintf("%s %d %d", s.o.Binary, fi.Size(), fi.ModTime().UnixNano())
	}
	h := sha256.Sum256([]byte(strings.Join(append([]string{binary}, s.environ("")...), "\x00")))
	return hex.EncodeToString(h[:])
}

func (s *Service) readRecord() (record, error) {
	var rec record
	b, err := os.ReadFile(s.recordPath())
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("rate limit service record: %w", err)
	}
	return rec, nil
}

func (s *Service) writeRecord(rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return envoy.ReplaceFile(s.recordPath(), b)
}

// Find returns the path of the rate limit service's binary: explicit, else
// $SERVEMESH_RATELIMIT, else ratelimit in a .tools/bin above this binary
// or the working folder (make tools builds it there), else on $PATH.
func Find(explicit string) (string, error) {
	return toolpath.Find("ratelimit", "SERVEMESH_RATELIMIT", explicit)
}

// StopLeft stops the service an agent left running in the Envoy's folder
// workDir, if any (servemesh agent --stop-all); it returns its pid, 0 if
// none ran.
func StopLeft(workDir string, grace time.Duration) (int, error) {
	s := &Service{dir: filepath.Join(workDir, "ratelimit")}
	rec, err := s.readRecord()
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if p, err := proc.Adopt(rec.Process); err == nil {
		_ = p.Stop(grace) // its exit status, which went to its parent
	}
	if rec.Process.Alive() {
		return 0, fmt.Errorf("stop the rate limit service: process %d still runs", rec.Process.Pid)
	}
	_ = os.Remove(s.recordPath())
	return rec.Process.Pid, nil
}
