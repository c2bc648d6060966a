package agent

import (
	"bufio"
	"bytes"
	"context"
	"regexp"
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

// EnvoyRequestsInFlight reads them from admin: each host's rq_active in
// /clusters, and each of the replica's clusters' upstream_rq_active in
// /stats. A cluster that changes is made anew in Envoy, and the requests
// the old one carries leave /clusters (they would read as none, and the
// replica be stopped under them: a promoted rollout's old version was);
// the cluster's gauge, kept by name, still counts them. So a replica's
// requests in a cluster are at least its host's, and at least the
// cluster's less its other hosts'.
func EnvoyRequestsInFlight(admin envoy.Admin) RequestsInFlight {
	return func(ctx context.Context, addr string) (int, error) {
		body, err := admin.Get(ctx, "/clusters")
		if err != nil {
			return 0, err
		}
		hosts := activeByHost(body)
		var names []string
		for c, active := range hosts {
			if _, ok := active[addr]; ok {
				names = append(names, regexp.QuoteMeta(c))
			}
		}
		if len(names) == 0 {
			return 0, nil
		}
		gauges, err := admin.Stats(ctx, `^cluster\.(`+strings.Join(names, "|")+`)\.upstream_rq_active$`)
		if err != nil {
			return 0, err
		}
		total := 0
		for c, active := range hosts {
			mine, ok := active[addr]
			if !ok {
				continue
			}
			others := 0
			for h, n := range active {
				if h != addr {
					others += n
				}
			}
			total += max(mine, int(gauges["cluster."+c+".upstream_rq_active"])-others)
		}
		return total, nil
	}
}

// activeByHost reads /clusters' text lines "<cluster>::<host>::rq_active::<n>"
// into each cluster's hosts' rq_active.
func activeByHost(clusters []byte) map[string]map[string]int {
	out := map[string]map[string]int{}
	s := bufio.NewScanner(bytes.NewReader(clusters))
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		parts := strings.Split(s.Text(), "::")
		if len(parts) != 4 || parts[2] != "rq_active" {
			continue
		}
		n, err := strconv.Atoi(parts[3])
		if err != nil {
			continue
		}
		if out[parts[0]] == nil {
			out[parts[0]] = map[string]int{}
		}
		out[parts[0]][parts[1]] += n
	}
	return out
}

// drainPoll is how often a draining replica's requests in flight are read.
const drainPoll = 250 * time.Millisecond

// awaitDrained stops the replica once it is drained, or at bound after
// since; it returns early, leaving the replica, when done closes (the
// agent stops: the next one resumes the drain).
func (r *replica) awaitDrained(done <-chan struct{}, since time.Time, bound time.Duration) {
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	defer r.a.state.draining.Delete(r.tag)
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
		n, err := r.inFlight()
		if err == nil {
			r.a.state.draining.Store(r.tag, n)
		}
		if draining >= r.a.drainGrace && err == nil && n == 0 {
			r.log.Info("replica drained: no request in flight", "draining_for", draining.Round(time.Millisecond))
			r.stop()
			return
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
