// Package heartbeat feeds a Consul TTL check, the one way servemesh keeps
// its registrations (an agent's node, each replica, a controller's session
// check) alive: when the process stops beating, Consul marks the check
// critical on its own.
package heartbeat

import (
	"context"
	"log/slog"
	"time"

	"github.com/hashicorp/consul/api"
)

// Probe returns the check's next status (api.HealthPassing or
// api.HealthCritical) and a note for its output.
type Probe func(ctx context.Context) (status, output string)

// Passing is the probe of a check that passes while its process lives.
func Passing(context.Context) (string, string) { return api.HealthPassing, "" }

// Run updates checkID from probe every interval until ctx ends. A failed
// update is logged and retried at the next beat.
func Run(ctx context.Context, agent *api.Agent, checkID string, interval time.Duration, probe Probe, log *slog.Logger) {
	RunProbing(ctx, agent, checkID, interval, interval, probe, log)
}

// RunProbing is Run that, while the check does not pass (a replica
// starting), probes every fast instead, so the check passes soon after its
// process is ready; Consul hears of it when the status changes, and every
// interval in any case.
func RunProbing(ctx context.Context, agent *api.Agent, checkID string, interval, fast time.Duration, probe Probe, log *slog.Logger) {
	var last string
	var sent time.Time
	for {
		wait := interval
		if last != api.HealthPassing {
			wait = fast
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		status, output := probe(ctx)
		if status == last && time.Since(sent) < interval-fast/2 {
			continue // nothing new, and the TTL is far from running out
		}
		if err := agent.UpdateTTL(checkID, output, status); err != nil {
			if ctx.Err() == nil {
				log.Warn("heartbeat failed; retrying at the next beat", "check", checkID, "err", err)
			}
			continue
		}
		last, sent = status, time.Now()
	}
}
