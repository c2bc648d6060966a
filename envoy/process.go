package envoy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
)

// Config is how to run one Envoy.
type Config struct {
	// Binary is the Envoy executable (see Find).
	Binary string
	// ConfigPath is the bootstrap file passed with -c.
	ConfigPath string
	// Dir is Envoy's working directory, where relative paths in its
	// configuration (wire.SecretsDir) resolve; the caller's when empty.
	Dir string
	// AdminSocket is the admin API's Unix socket, as in the bootstrap.
	AdminSocket string
	// LogPath receives Envoy's stdout and stderr (appended). Required.
	LogPath string
	// LogLevel is Envoy's --log-level; "warning" when empty.
	LogLevel string
	// Concurrency is Envoy's worker thread count; Envoy's default when 0.
	Concurrency int
	// DrainTime is Envoy's --drain-time-s: how long listeners drain. 5s when 0.
	DrainTime time.Duration
	// ExtraArgs are appended to the command line as given.
	ExtraArgs []string
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL; 5s when 0.
	StopGrace time.Duration
	// Logger receives the supervisor's logs; required.
	Logger *slog.Logger
	// HotRestart starts Envoy for hot restarts (Envoy's --restart-epoch):
	// detached, so that it outlives its supervisor, with hot restart on,
	// at epoch Epoch. Epoch 0 picks a free base id and writes it to
	// BaseIDPath; a later epoch takes over from the Envoy running with
	// base id BaseID, which drains and exits once the new one is ready.
	// Otherwise Envoy dies with its parent and has hot restart off.
	HotRestart bool
	Epoch      int
	BaseID     int
	BaseIDPath string
	// SocketPath, with HotRestart, is where the hot restart's Unix sockets
	// are made (Envoy's --socket-path; Envoy appends their role and base
	// id), relative to Dir, mode 0600, in a folder only the node's user
	// enters: whoever
	// reaches them takes Envoy's listening sockets or stops it. Every
	// epoch of one Envoy uses the same. Empty, Envoy's default: sockets
	// in the abstract namespace, which any local user reaches (what
	// earlier releases started: see envoyRecord.SocketPath).
	SocketPath string
	// Parent, with HotRestart, is the servemesh binary, whose
	// envoy-parent command parents Envoy (see RunParent).
	Parent string
	// UpgradeGrace, with HotRestart, is how long after its drain time an
	// Envoy this one replaces goes on serving the requests it has open
	// (long answer streams above all) before this one ends it: Envoy's
	// --parent-shutdown-time-s is the two together. 5s when 0.
	UpgradeGrace time.Duration
}

// Args returns Envoy's full command line (without the binary).
func (c Config) Args() []string {
	args := c.settings()
	if !c.HotRestart {
		// Several Envoys share one machine in tests and demos; one that is
		// never hot restarted needs no base id of its own.
		return append(args, "--disable-hot-restart")
	}
	args = append(args, "--restart-epoch", strconv.Itoa(c.Epoch),
		// The old Envoy drains for the drain time and serves its open
		// requests for the upgrade grace, then the new one ends it.
		"--parent-shutdown-time-s", strconv.Itoa(int(c.parentShutdown().Seconds())))
	if c.SocketPath != "" {
		args = append(args, "--socket-path", c.SocketPath, "--socket-mode", "600")
	}
	if c.Epoch == 0 {
		return append(args, "--use-dynamic-base-id", "--base-id-path", c.BaseIDPath)
	}
	return append(args, "--base-id", strconv.Itoa(c.BaseID))
}

// defaultUpgradeGrace is the upgrade grace when none is given, what
// earlier releases always gave.
const defaultUpgradeGrace = 5 * time.Second

// parentShutdown is how long after a hot restart the new Envoy ends the
// one it replaced (Envoy's --parent-shutdown-time-s), whole seconds.
func (c Config) parentShutdown() time.Duration {
	grace := c.UpgradeGrace
	if grace == 0 {
		grace = defaultUpgradeGrace
	}
	return (c.drainTime() + grace).Truncate(time.Second)
}

func (c Config) drainTime() time.Duration {
	if c.DrainTime == 0 {
		return 5 * time.Second
	}
	return max(c.DrainTime, time.Second)
}

// settings are the arguments that say how Envoy runs, the same in every
// epoch: when they change, a running Envoy is hot restarted.
func (c Config) settings() []string {
	level := c.LogLevel
	if level == "" {
		level = "warning"
	}
	args := []string{
		"-c", c.ConfigPath,
		"--log-level", level,
		"--drain-time-s", strconv.Itoa(int(c.drainTime().Seconds())),
	}
	if c.Concurrency > 0 {
		args = append(args, "--concurrency", strconv.Itoa(c.Concurrency))
	}
	return append(args, c.ExtraArgs...)
}

// Process is a running Envoy child process.
type Process struct {
	cfg   Config
	child *proc.Process
	admin Admin
}

// Start launches Envoy. Unless cfg.HotRestart, the child is killed if this
// process dies (Pdeathsig), so an Envoy is never orphaned by a crashed
// supervisor; a hot-restartable one outlives it, to be adopted.
func Start(cfg Config) (*Process, error) {
	if cfg.Logger == nil {
		return nil, errors.New("envoy: start: Config.Logger is required")
	}
	if cfg.LogPath == "" {
		return nil, errors.New("envoy: start: Config.LogPath is required")
	}
	// Only the node's user reads Envoy's log: at debug levels it holds
	// requests' headers, Authorization included.
	logFile, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		err = logFile.Chmod(0o600) // a log an older version left readable
	}
	if err != nil {
		return nil, fmt.Errorf("envoy: open log file: %w", err)
	}
	spec := proc.Spec{Path: cfg.Binary, Args: cfg.Args(), Dir: cfg.Dir, Stdout: logFile, Stderr: logFile}
	if cfg.HotRestart {
		if cfg.Parent == "" {
			return nil, errors.New("envoy: start: a hot-restartable Envoy needs Config.Parent")
		}
		spec.Path, spec.Args, spec.Detached = cfg.Parent, append([]string{ParentCommand, "--", cfg.Binary}, spec.Args...), true
	}
	child, err := proc.Start(spec)
	_ = logFile.Close() // the child holds its own descriptor
	if err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	p := &Process{cfg: cfg, child: child, admin: Admin{Socket: cfg.AdminSocket}}
	cfg.Logger.Info("envoy started", "pid", child.Pid(), "binary", cfg.Binary, "config", cfg.ConfigPath, "log", cfg.LogPath, "epoch", cfg.Epoch)
	return p, nil
}

// Pid is the child's process id.
func (p *Process) Pid() int { return p.child.Pid() }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.child.Done() }

// ExitErr is the process's exit status once Done is closed.
func (p *Process) ExitErr() error { return p.child.Wait() }

// Admin returns a client for the process's admin API.
func (p *Process) Admin() Admin { return p.admin }

// WaitReady waits until Envoy's /ready says LIVE. It fails early if Envoy
// exits, quoting the end of its log.
func (p *Process) WaitReady(ctx context.Context) error {
	return p.waitUntil(ctx, "ready", func(probe context.Context) bool {
		ready, _ := p.admin.Ready(probe)
		return ready
	})
}

// waitUntil polls live (each call bounded to a second) until it holds,
// failing when ctx ends or the Envoy exits, quoting the end of its log.
func (p *Process) waitUntil(ctx context.Context, what string, live func(context.Context) bool) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		probe, cancel := context.WithTimeout(ctx, time.Second)
		ok := live(probe)
		cancel()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envoy pid %d not %s: %w; log tail:\n%s", p.Pid(), what, ctx.Err(), proc.LogTail(p.cfg.LogPath, 2048))
		case <-p.Done():
			return fmt.Errorf("envoy exited before it was %s (%w); log tail:\n%s", what, p.ExitErr(), proc.LogTail(p.cfg.LogPath, 2048))
		case <-tick.C:
		}
	}
}

// Stop drains Envoy's listeners through the admin API, waits up to drain for
// connections to finish, then sends SIGTERM, and SIGKILL if it has not exited
// within StopGrace more. It returns when the process is gone.
func (p *Process) Stop(ctx context.Context, drain time.Duration) error {
	if p.child.Exited() {
		return nil
	}
	if drain > 0 {
		drainCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := p.admin.DrainListeners(drainCtx)
		cancel()
		if err != nil {
			p.cfg.Logger.Warn("envoy drain request failed; stopping without drain", "pid", p.Pid(), "err", err)
		} else {
			p.cfg.Logger.Info("envoy draining", "pid", p.Pid(), "for", drain)
			select {
			case <-p.Done():
				return nil
			case <-time.After(drain):
			case <-ctx.Done():
			}
		}
	}
	grace := p.cfg.StopGrace
	if grace == 0 {
		grace = 5 * time.Second
	}
	_ = p.child.Stop(grace)
	p.cfg.Logger.Info("envoy stopped", "pid", p.Pid())
	return nil
}
