package envoy

import (
	"context"
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
	// OnStart, if set, is called with each new process.
	OnStart func(*Process)
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
	for starts := 1; ; starts++ {
		p, err := Start(s.Config)
		if err != nil {
			return err
		}
		if s.OnStart != nil {
			s.OnStart(p)
		}
		began := time.Now()
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.Background(), s.Drain+10*time.Second)
			defer cancel()
			return p.Stop(stopCtx, s.Drain)
		case <-p.Done():
		}
		delay := restart.Next(time.Since(began))
		s.Config.Logger.Error("envoy exited; restarting", "pid", p.Pid(), "exit", p.ExitErr(), "restart_in", delay,
			"restarts", starts, "log_tail", proc.LogTail(s.Config.LogPath, 512))
		if !backoff.Sleep(ctx, delay) {
			return nil
		}
	}
}
