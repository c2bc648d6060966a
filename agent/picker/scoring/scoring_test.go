package scoring

import (
	"math"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// TestChoose: the policy alone, case by case.
func TestChoose(t *testing.T) {
	limits := Limits{MaxInFlight: 4, QueueLimit: 5, KVCacheLimit: 0.9}
	fresh := func(s Server) Server { s.At = now; return s }
	for _, c := range []struct {
		name      string
		replicas  []Replica
		known     bool
		sheddable bool
		want      int
		shed      bool
	}{
		{"none ready: Envoy picks", nil, true, false, -1, false},
		{"the faster of two idle", []Replica{{TTFB: ms(300)}, {TTFB: ms(100)}}, true, false, 1, false},
		{"the idle one over a busy faster one", []Replica{{TTFB: ms(100), InFlight: 3}, {TTFB: ms(200)}}, true, false, 1, false},
		{"among equals, the first", []Replica{{TTFB: ms(100)}, {TTFB: ms(100)}}, true, false, 0, false},
		{"a new replica is tried at the typical time", []Replica{{TTFB: ms(100), InFlight: 1}, {}}, true, false, 1, false},
		{"the server's own queue counts", []Replica{{TTFB: ms(100), Server: fresh(Server{Waiting: 3, HasWaiting: true})}, {TTFB: ms(150)}}, true, false, 1, false},
		{"stale server figures do not", []Replica{{TTFB: ms(100), Server: Server{At: now.Add(-Stale), Waiting: 3, HasWaiting: true}}, {TTFB: ms(150)}}, true, false, 0, false},
		{"a full KV cache doubles the cost", []Replica{{TTFB: ms(100), Server: fresh(Server{KV: 0.8, HasKV: true})}, {TTFB: ms(150)}}, true, false, 1, false},
		{"a saturated replica only if all are", []Replica{{TTFB: ms(10), InFlight: 4}, {TTFB: ms(500), InFlight: 3}}, true, false, 1, false},
		{"all saturated: sheddable is shed", []Replica{{TTFB: ms(10), InFlight: 4}, {TTFB: ms(20), InFlight: 4}}, true, true, -1, true},
		{"all saturated: critical goes to the cheapest", []Replica{{TTFB: ms(30), InFlight: 4}, {TTFB: ms(20), InFlight: 4}}, true, false, 1, false},
		{"queue limit saturates", []Replica{{TTFB: ms(10), Server: fresh(Server{Waiting: 5, HasWaiting: true})}}, true, true, -1, true},
		{"KV-cache limit saturates", []Replica{{TTFB: ms(10), Server: fresh(Server{KV: 0.95, HasKV: true})}}, true, true, -1, true},
		{"unknown limits saturate nothing", []Replica{{TTFB: ms(10), InFlight: 100}}, false, true, 0, false},
		{"the replica holding the prompt's prefix, though busier", []Replica{{TTFB: ms(100)}, {TTFB: ms(100), InFlight: 2, PrefixHit: 1}}, true, false, 1, false},
		{"a longer cached prefix over a shorter one", []Replica{{TTFB: ms(100), PrefixHit: 0.3}, {TTFB: ms(100), PrefixHit: 0.9}}, true, false, 1, false},
		{"imbalanced: load wins past four times the pending", []Replica{{TTFB: ms(100), InFlight: 3}, {TTFB: ms(100), InFlight: 16, PrefixHit: 1}}, false, false, 0, false},
		{"not yet imbalanced: the prefix wins", []Replica{{TTFB: ms(100), InFlight: 3}, {TTFB: ms(100), InFlight: 14, PrefixHit: 1}}, false, false, 1, false},
		{"the replica with the model loaded, though busier", []Replica{{TTFB: ms(100), ModelMiss: 1}, {TTFB: ms(100), InFlight: 3}}, false, false, 1, false},
		{"room for the model over dropping another", []Replica{{TTFB: ms(100), ModelMiss: 2}, {TTFB: ms(100), ModelMiss: 1}}, false, false, 1, false},
		{"the model loaded, until five times the pending", []Replica{{TTFB: ms(100), ModelMiss: 1}, {TTFB: ms(100), InFlight: 5}}, false, false, 0, false},
		{"a saturated replica, even holding the prefix, only if all are", []Replica{{TTFB: ms(100), InFlight: 4, PrefixHit: 1}, {TTFB: ms(100), InFlight: 3}}, true, false, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, shed := Choose(c.replicas, limits, c.known, c.sheddable, now, Typical(c.replicas))
			if got != c.want || shed != c.shed {
				t.Fatalf("Choose = %d, shed %v; want %d, shed %v", got, shed, c.want, c.shed)
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
