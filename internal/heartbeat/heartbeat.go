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
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		status, output := probe(ctx)
		if err := agent.UpdateTTL(checkID, output, status); err != nil && ctx.Err() == nil {
			log.Warn("heartbeat failed; retrying at the next beat", "check", checkID, "err", err)
		}
	}
}
