package agent

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/envoy"
)

// Draining a replica: once its placement is draining, the nodes' Envoys
// send it no new request (its endpoints are DRAINING), and the agent
// stops it when it has served what it has in flight (a model's long
// answer streams above all), at least the drain grace after the drain
// began (while the Envoys hear of it) and at most its backend's graceful
// shutdown timeout, cutting what is left then. Both are counted from the
// placement's Since, which the controller stores, so an agent restarted
// meanwhile resumes the drain where it was.

// RequestsInFlight counts the requests the node's Envoy has in flight to
// the replica listening at addr (host:port), over all its clusters: the
// node's own callers' and, through its inbound listener, other nodes'.
type RequestsInFlight func(ctx context.Context, addr string) (int, error)

// EnvoyRequestsInFlight reads them from admin's /clusters (each host's
// rq_active).
func EnvoyRequestsInFlight(admin envoy.Admin) RequestsInFlight {
	return func(ctx context.Context, addr string) (int, error) {
		body, err := admin.Get(ctx, "/clusters")
		if err != nil {
			return 0, err
		}
		return hostRequestsActive(body, addr), nil
	}
}

// hostRequestsActive sums the rq_active of addr over /clusters' text
// lines, "<cluster>::<host>::rq_active::<n>".
func hostRequestsActive(clusters []byte, addr string) int {
	total := 0
	needle := "::" + addr + "::rq_active::"
	s := bufio.NewScanner(bytes.NewReader(clusters))
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		_, n, ok := strings.Cut(s.Text(), needle)
		if !ok {
			continue
		}
		if v, err := strconv.Atoi(n); err == nil {
			total += v
		}
	}
	return total
}

// drainPoll is how often a draining replica's requests in flight are read.
const drainPoll = 250 * time.Millisecond

// awaitDrained stops the replica once it is drained, or at bound after
// since; it returns early, leaving the replica, when done closes (the
// agent stops: the next one resumes the drain).
func (r *replica) awaitDrained(done <-chan struct{}, since time.Time, bound time.Duration) {
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for {
		draining := time.Since(since)
		if draining >= bound {
			n, _ := r.inFlight()
			r.log.Warn("replica stopped at its backend's graceful shutdown timeout: its requests still in flight are cut",
				"in_flight", n, "graceful_shutdown_timeout", bound)
			r.a.metrics.drainCuts.WithLabelValues(r.backend).Inc()
			r.stop()
			return
		}
		if draining >= r.a.drainGrace {
			if n, err := r.inFlight(); err == nil && n == 0 {
				r.log.Info("replica drained: no request in flight", "draining_for", draining.Round(time.Millisecond))
				r.stop()
				return
			}
		}
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

// inFlight is the replica's requests in flight, as the node's Envoy counts
// them; none without an Envoy to ask.
func (r *replica) inFlight() (int, error) {
	if r.a.inFlight == nil {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return r.a.inFlight(ctx, r.address())
}
