package envoy

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/proc"
)

// Supervisor keeps one Envoy running: it restarts it with exponential backoff
// when it exits, and drains and stops it when its context ends.
type Supervisor struct {
	// Config is how to run Envoy.
	Config Config
	// Drain is how long listeners drain on shutdown.
	Drain time.Duration
	// MinBackoff and MaxBackoff bound the wait before a restart; 500ms and
	// 30s when zero. The backoff resets after Envoy has run for a minute.
	MinBackoff, MaxBackoff time.Duration
	// OnStart, if set, is called with each new (or adopted) process.
	OnStart func(*Process)
	// StateFile, with Config.HotRestart, is where the supervisor writes
	// down the Envoy it runs: when it stops, it leaves that Envoy serving
	// (unless StopOnExit), and the next supervisor adopts or hot restarts
	// it (see handover.go).
	StateFile  string
	StopOnExit bool
	// Listeners are the addresses the node's Envoy listens on: the first
	// Envoy a supervisor starts (none of its own runs) is not started
	// while another process holds one, since Envoy binds with SO_REUSEPORT
	// and would share the port with another node's Envoy.
	Listeners []Listener

	want     envoyRecord      // what this supervisor starts
	deferred *deferredRestart // a hot restart waiting for an earlier epoch's requests
}

// Run supervises Envoy until ctx ends, then stops it with a drain. It returns
// the error of the last start attempt if Envoy could not be started at all.
func (s *Supervisor) Run(ctx context.Context) error {
	restart := backoff.Backoff{Min: s.MinBackoff, Max: s.MaxBackoff, ResetAfter: time.Minute}
	if restart.Min == 0 {
		restart.Min = 500 * time.Millisecond
	}
	if restart.Max == 0 {
		restart.Max = 30 * time.Second
	}
	p, err := s.firstStart(ctx)
	for restarts := 0; ; {
		if err != nil {
			return err
		}
		if s.OnStart != nil {
			s.OnStart(p)
		}
		began := time.Now()
		next, exited := s.serve(ctx, p)
		if !exited {
			if next == nil {
				return s.stop(p)
			}
			p = next // a deferred hot restart took over
			continue
		}
		s.deferred = nil // its Envoy is gone; the next starts afresh anyway
		restarts++
		delay := restart.Next(time.Since(began))
		s.Config.Logger.Error("envoy exited; restarting", "pid", p.Pid(), "exit", p.ExitErr(), "restart_in", delay,
			"restarts", restarts, "cause", crashCause(proc.LogTail(s.Config.LogPath, 1<<20)), "log_tail", proc.LogTail(s.Config.LogPath, 8192))
		if !backoff.Sleep(ctx, delay) {
			return nil
		}
		p, err = s.start(0, 0, s.Config.SocketPath)
	}
}

// serve waits while p serves: it reports exited when p exits, returns
// the next epoch once a deferred hot restart has taken over, and returns
// neither when ctx ends.
func (s *Supervisor) serve(ctx context.Context, p *Process) (next *Process, exited bool) {
	var retry <-chan time.Time
	if s.deferred != nil {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		retry = tick.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil, false
		case <-p.Done():
			return nil, true
		case <-retry:
			if s.earlierEpochServes(ctx, p, s.deferred.rec) {
				continue
			}
			d := s.deferred
			s.deferred = nil
			if next := s.hotRestart(ctx, d.rec, d.baseID, p); next != p {
				return next, false
			}
			retry = nil // the next epoch failed; the running one serves on, as after a failed hot restart at start
		}
	}
}

// stop ends supervision: it leaves the Envoy serving for the next
// supervisor, or drains and stops it.
func (s *Supervisor) stop(p *Process) error {
	if s.leaves() {
		s.Config.Logger.Info("envoy left serving for the next agent to adopt", "pid", p.Pid())
		return nil
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), s.Drain+10*time.Second)
	defer cancel()
	err := p.Stop(stopCtx, s.Drain)
	if s.StateFile != "" {
		_ = os.Remove(s.StateFile)
	}
	select {
	case <-p.Done():
		if s.Config.BaseIDPath != "" {
			removeSharedMemory(s.Config.BaseIDPath)
		}
	default: // it outlived its stop: its region stays
	}
	return err
}

// leaves reports whether the supervisor leaves its Envoy running when it
// stops.
func (s *Supervisor) leaves() bool {
	return s.Config.HotRestart && s.StateFile != "" && !s.StopOnExit
}

// firstStart starts Envoy, or with a state file adopts or hot restarts
// the one a previous supervisor left.
func (s *Supervisor) firstStart(ctx context.Context) (*Process, error) {
	if s.Config.HotRestart && s.StateFile != "" {
		return s.first(ctx)
	}
	return s.startFresh(ctx)
}

// Listener is an address a node's Envoy listens on, and what it is for.
type Listener = proc.Listener

// startFresh starts the first Envoy where none of this node's runs,
// once none of its listeners is held by another process.
func (s *Supervisor) startFresh(ctx context.Context) (*Process, error) {
	for _, l := range s.Listeners {
		if err := proc.CheckFree(ctx, l.What, l.Addr); err != nil {
			return nil, fmt.Errorf("%w: is another node's agent (or another demo-stack) running here? Stop it, or give this node other addresses", err)
		}
	}
	return s.start(0, 0, s.Config.SocketPath)
}

// crashCause is what a crashed Envoy's log says of why, from log (its
// end): the lines from its first bug, assertion or critical line on,
// before the backtrace and the dump of what it was doing (which fill the
// log's tail); "" if none.
func crashCause(log string) string {
	lines := strings.Split(log, "\n")
	for i, l := range lines {
		if strings.Contains(l, "envoy bug failure:") || strings.Contains(l, "assert failure:") || strings.Contains(l, "panic:") || strings.Contains(l, "][critical][") {
			end := min(len(lines), i+4)
			return strings.Join(lines[i:end], "\n")
		}
	}
	return ""
}
