package scoring

import (
	"math"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// TestFreeCheapest: the pipeline's pick among free replicas by cost alone
// (no conversation, no affinity), case by case; a sheddable request, so
// that none is picked when every one is saturated.
func TestFreeCheapest(t *testing.T) {
	limits := Limits{MaxInFlight: 4, QueueLimit: 5, KVCacheLimit: 0.9}
	fresh := func(s Server) Server { s.At = now; return s }
	for _, c := range []struct {
		name     string
		replicas []Replica
		known    bool
		want     int
	}{
		{"none ready: none", nil, true, -1},
		{"the faster of two idle", []Replica{{TTFB: ms(300)}, {TTFB: ms(100)}}, true, 1},
		{"the idle one over a busy faster one", []Replica{{TTFB: ms(100), InFlight: 3}, {TTFB: ms(200)}}, true, 1},
		{"among equals, the first", []Replica{{TTFB: ms(100)}, {TTFB: ms(100)}}, true, 0},
		{"a new replica is tried at the typical time", []Replica{{TTFB: ms(100), InFlight: 1}, {}}, true, 1},
		{"the server's own queue counts", []Replica{{TTFB: ms(100), Server: fresh(Server{Waiting: 3, HasWaiting: true})}, {TTFB: ms(150)}}, true, 1},
		{"stale server figures do not", []Replica{{TTFB: ms(100), Server: Server{At: now.Add(-Stale), Waiting: 3, HasWaiting: true}}, {TTFB: ms(150)}}, true, 0},
		{"a full KV cache doubles the cost", []Replica{{TTFB: ms(100), Server: fresh(Server{KV: 0.8, HasKV: true})}, {TTFB: ms(150)}}, true, 1},
		{"a free replica over a faster saturated one", []Replica{{TTFB: ms(10), InFlight: 4}, {TTFB: ms(500), InFlight: 3}}, true, 1},
		{"all saturated: none (the request waits or is shed)", []Replica{{TTFB: ms(10), InFlight: 4}, {TTFB: ms(20), InFlight: 4}}, true, -1},
		{"queue limit saturates", []Replica{{TTFB: ms(10), Server: fresh(Server{Waiting: 5, HasWaiting: true})}}, true, -1},
		{"KV-cache limit saturates", []Replica{{TTFB: ms(10), Server: fresh(Server{KV: 0.95, HasKV: true})}}, true, -1},
		{"unknown limits saturate nothing", []Replica{{TTFB: ms(10), InFlight: 100}}, false, 0},
		{"the replica holding the prompt's prefix, though busier", []Replica{{TTFB: ms(100)}, {TTFB: ms(100), InFlight: 2, PrefixHit: 1}}, true, 1},
		{"a longer cached prefix over a shorter one", []Replica{{TTFB: ms(100), PrefixHit: 0.3}, {TTFB: ms(100), PrefixHit: 0.9}}, true, 1},
		{"imbalanced: load wins past four times the pending", []Replica{{TTFB: ms(100), InFlight: 3}, {TTFB: ms(100), InFlight: 16, PrefixHit: 1}}, false, 0},
		{"not yet imbalanced: the prefix wins", []Replica{{TTFB: ms(100), InFlight: 3}, {TTFB: ms(100), InFlight: 14, PrefixHit: 1}}, false, 1},
		{"the replica with the model loaded, though busier", []Replica{{TTFB: ms(100), ModelMiss: 1}, {TTFB: ms(100), InFlight: 3}}, false, 1},
		{"room for the model over dropping another", []Replica{{TTFB: ms(100), ModelMiss: 2}, {TTFB: ms(100), ModelMiss: 1}}, false, 1},
		{"the model loaded, until five times the pending", []Replica{{TTFB: ms(100), ModelMiss: 1}, {TTFB: ms(100), InFlight: 5}}, false, 0},
		{"a free replica over a saturated one holding the prefix", []Replica{{TTFB: ms(100), InFlight: 4, PrefixHit: 1}, {TTFB: ms(100), InFlight: 3}}, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cands := make([]Candidate, len(c.replicas))
			for i, r := range c.replicas {
				cands[i] = Candidate{Replica: r}
			}
			pass := Run(cands, Ask{Priority: -1, Limits: limits, Known: c.known, Now: now, Typical: Typical(c.replicas)})
			if pass.Picked != c.want || (c.want >= 0 && pass.Why != WhyFree) {
				t.Fatalf("picked %d (%s); want %d, the cheapest free: %s", pass.Picked, pass.Why, c.want, pass)
			}
		})
	}
}

// TestSmooth: the first answer sets the time, later ones move it by
// TTFBWeight.
func TestSmooth(t *testing.T) {
	if got := Smooth(0, ms(100)); got != ms(100) {
		t.Fatalf("first: %v", got)
	}
	if got := Smooth(ms(100), ms(200)); got != ms(130) {
		t.Fatalf("then: %v, want 130ms", got)
	}
}

// TestNodeReport: capacity is max_concurrent_queries over each replica's
// bounded time squared; a saturated replica counts for a tenth; a replica
// answering at once counts for at most ten times one at 10 ms; no ready
// replica reports full.
func TestNodeReport(t *testing.T) {
	l := Limits{MaxInFlight: 10}
	one := NodeReport([]Replica{{TTFB: ms(100)}}, l, true, 5, now, ms(100))
	// capacity 10 / (0.1 s × 0.1 s) = 1000: utilization 5/1000.
	if math.Abs(one.Utilization-0.005) > 1e-12 || one.RPS != 5 {
		t.Fatalf("one replica at 100 ms: %+v", one)
	}
	saturated := NodeReport([]Replica{{TTFB: ms(100), InFlight: 10}}, l, true, 5, now, ms(100))
	if math.Abs(saturated.Utilization-0.05) > 1e-12 || saturated.InFlight != 10 {
		t.Fatalf("saturated: %+v, want a tenth of the capacity", saturated)
	}
	instant := NodeReport([]Replica{{TTFB: time.Microsecond}}, l, true, 1, now, ms(1))
	tenMS := NodeReport([]Replica{{TTFB: ms(10)}}, l, true, 1, now, ms(10))
	if ratio := tenMS.Utilization / instant.Utilization; ratio > 10.0001 {
		t.Fatalf("a replica answering at once weighs %v times one at 10 ms; at most 10", ratio)
	}
	if none := NodeReport(nil, l, true, 0, now, ms(1)); none.Utilization != 1 {
		t.Fatalf("no ready replica: %+v, want full", none)
	}
	if h := one.Header(); !strings.HasPrefix(h, "TEXT application_utilization=0.005,rps_fractional=5,named_metrics.in_flight=0") {
		t.Fatalf("header %q", h)
	}
}

// TestRoom: with every replica saturated, a request of priority 0 or
// more goes to the cheapest whose node counts room under
// max_concurrent_queries whatever its server reports; none when every one
// is full by the count, and none for a sheddable request.
func TestRoom(t *testing.T) {
	limits := Limits{MaxInFlight: 4, QueueLimit: 5}
	full := Server{At: now, Waiting: 5, HasWaiting: true}
	ask := Ask{Limits: limits, Known: true, Now: now, Typical: ms(10)}
	cands := []Candidate{{Replica: Replica{TTFB: ms(10), InFlight: 4}}, {Replica: Replica{TTFB: ms(20), InFlight: 1, Server: full}}}
	if pass := Run(cands, ask); pass.Picked != 1 || pass.Why != WhyRoom {
		t.Errorf("picked %d (%s); want 1, the one with room by the count though its queue is full: %s", pass.Picked, pass.Why, pass)
	}
	ask.Priority = -1
	if pass := Run(cands, ask); pass.Picked != -1 {
		t.Errorf("a sheddable request took %d: %s", pass.Picked, pass)
	}
	ask.Priority = 0
	cands[1].InFlight = 4
	if pass := Run(cands, ask); pass.Picked != -1 {
		t.Errorf("picked %d; want none: every one at max_concurrent_queries: %s", pass.Picked, pass)
	}
}

// TestKeepsHome: a prompt's home keeps it while its requests pending plus
// one are at most HomeLoad times the cheapest's, by the node's count or
// its server's fresh figures, whatever their times to first byte.
func TestKeepsHome(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	cases := []struct {
		home, cheapest Replica
		keeps          bool
	}{
		{Replica{InFlight: 3, TTFB: time.Second}, Replica{TTFB: time.Millisecond}, true},
		{Replica{InFlight: 4}, Replica{}, false},
		{Replica{InFlight: 7}, Replica{InFlight: 1}, true},
		{Replica{InFlight: 1, Server: Server{HasWaiting: true, Waiting: 9, At: now}}, Replica{InFlight: 1}, false},
	}
	for i, c := range cases {
		if got := KeepsHome(c.home, c.cheapest, now); got != c.keeps {
			t.Errorf("case %d: KeepsHome(%+v, %+v) = %v, want %v", i, c.home, c.cheapest, got, c.keeps)
		}
	}
}

// TestFailuresSetNoPaceAndCostTime: a replica whose last answer failed is
// not the typical pace a new replica is taken at, its failure counts as
// FailurePenalty times its time, and two in a row make it failing.
func TestFailuresSetNoPaceAndCostTime(t *testing.T) {
	failed := Replica{TTFB: time.Millisecond, Failures: 1}
	steady := Replica{TTFB: 80 * time.Millisecond}
	if got := Typical([]Replica{failed, steady, {}}); got != 80*time.Millisecond {
		t.Errorf("typical %v; want the steady replica's 80ms, not the failed one's", got)
	}
	if got := FailedTTFB(failed, 80*time.Millisecond); got != FailurePenalty*80*time.Millisecond {
		t.Errorf("a failure of a replica faster than typical counts %v; want %d times typical", got, FailurePenalty)
	}
	if failed.Failing() || !(Replica{Failures: FailingAfter}).Failing() {
		t.Errorf("failing after %d in a row: one failure %v, %d failures %v", FailingAfter, failed.Failing(), FailingAfter, Replica{Failures: FailingAfter}.Failing())
	}
}

// TestModelHolder: the sticky picker's model holder, the least busy free
// replica holding the model, takes the request while it keeps its home
// against the cheapest (the first here), whatever their times; not a
// saturated or failing one; none when no one holds it.
func TestModelHolder(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := Limits{MaxInFlight: 8}
	slow := Replica{TTFB: time.Second}
	fast := Replica{TTFB: 10 * time.Millisecond, ModelMiss: 2}
	for _, c := range []struct {
		name  string
		ready []Replica
		want  int
	}{
		{"the holder, ten times slower", []Replica{fast, slow}, 1},
		{"the less busy of two holders", []Replica{{InFlight: 2}, {InFlight: 1}, fast}, 1},
		{"a holder too busy against an idle one", []Replica{fast, {InFlight: 4}}, -1},
		{"a saturated holder", []Replica{fast, {InFlight: 8}}, -1},
		{"a failing holder", []Replica{fast, {Failures: FailingAfter}}, -1},
		{"no holder", []Replica{fast, {ModelMiss: 1}}, -1},
	} {
		cands := make([]Candidate, len(c.ready))
		for i, r := range c.ready {
			cands[i] = Candidate{Replica: r}
		}
		ask := Ask{Model: true, Limits: l, Known: true, Now: now}
		free := keep(cands, []int{0, 1, 2}[:len(cands)], ask, freeFilter{})
		if got := modelHolder(cands, free, 0, ask); got != c.want {
			t.Errorf("%s: %d; want %d", c.name, got, c.want)
		}
	}
}
