package autoscale

import (
	"testing"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

var cfg = meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 6, TargetInFlight: 2,
	MetricsIntervalS: 1, LookBackPeriodS: 3, UpscaleDelayS: 2, DownscaleDelayS: 5}

// run feeds a constant load for d, one sample a second, and returns every
// scaling decision as (second, replicas).
func run(p *Policy, start time.Time, current *int, load float64, d int) [][2]int {
	var out [][2]int
	for s := range d {
		now := start.Add(time.Duration(s) * time.Second)
		p.Observe(Sample{At: now, InFlight: load}, 3*time.Second)
		if n, act := p.Decide(cfg, *current, now); act {
			*current = n
			out = append(out, [2]int{s, n})
		}
	}
	return out
}

func TestScalesUpAfterTheUpscaleDelay(t *testing.T) {
	p, current, t0 := &Policy{}, 1, time.Unix(1000, 0)
	got := run(p, t0, &current, 10, 10)
	if len(got) != 1 || got[0][1] != 5 || got[0][0] < 2 {
		t.Fatalf("10 in flight, target 2: decisions %v; want one, to 5 replicas, after 2s", got)
	}
}

func TestNeverAboveMaxNorBelowMin(t *testing.T) {
	p, current, t0 := &Policy{}, 1, time.Unix(1000, 0)
	run(p, t0, &current, 100, 10)
	if current != 6 {
		t.Fatalf("100 in flight: %d replicas, want max 6", current)
	}
	run(p, t0.Add(10*time.Second), &current, 0, 20)
	if current != 1 {
		t.Fatalf("no load: %d replicas, want min 1", current)
	}
}

func TestDownscaleWaitsLongerAndSteadyLoadNeverFlaps(t *testing.T) {
	p, current, t0 := &Policy{}, 1, time.Unix(1000, 0)
	run(p, t0, &current, 6, 10) // -> 3
	got := run(p, t0.Add(10*time.Second), &current, 6, 60)
	if len(got) != 0 || current != 3 {
		t.Fatalf("steady load flapped: %v (now %d)", got, current)
	}
	got = run(p, t0.Add(70*time.Second), &current, 0, 4)
	if len(got) != 0 {
		t.Fatalf("scaled down within the 5s downscale delay: %v", got)
	}
	got = run(p, t0.Add(74*time.Second), &current, 0, 10)
	if len(got) != 1 || current != 1 {
		t.Fatalf("after the downscale delay: %v (now %d)", got, current)
	}
}

// A spike shorter than the upscale delay does not scale, when the look-back
// period is no longer than that delay. (A longer look-back keeps a spike in
// the average for longer; that is the averaging working, as in Ray Serve.)
func TestABriefSpikeDoesNotScale(t *testing.T) {
	c := cfg
	c.LookBackPeriodS, c.UpscaleDelayS = 1, 3
	p, current, t0 := &Policy{}, 2, time.Unix(1000, 0)
	var decisions []int
	for s, load := range []float64{4, 4, 4, 40, 4, 4, 4, 4, 4, 4} {
		now := t0.Add(time.Duration(s) * time.Second)
		p.Observe(Sample{At: now, InFlight: load}, time.Second)
		if n, act := p.Decide(c, current, now); act {
			current = n
			decisions = append(decisions, n)
		}
	}
	if len(decisions) != 0 || current != 2 {
		t.Fatalf("a one-second spike scaled: %v", decisions)
	}
}

// A backend idle at min_replicas 0 goes to zero after the downscale delay,
// and its first request (held by a node's activator, in flight) wakes it
// at once, without the upscale delay.
func TestScalesToZeroAndWakesAtTheFirstRequest(t *testing.T) {
	zero := cfg
	zero.MinReplicas = 0
	p, current, now := &Policy{}, 2, time.Unix(1000, 0)
	decide := func(load float64) (int, bool) {
		now = now.Add(time.Second)
		p.Observe(Sample{At: now, InFlight: load}, 3*time.Second)
		return p.Decide(zero, current, now)
	}
	for range 10 {
		if n, act := decide(0); act {
			current = n
		}
	}
	if current != 0 {
		t.Fatalf("idle for 10 s with min_replicas 0 and a 5 s downscale delay: %d replicas, want 0", current)
	}
	if n, act := decide(0); act {
		t.Fatalf("idle at zero: scaled to %d", n)
	}
	n, act := decide(1)
	if !act || n != 1 {
		t.Fatalf("one request waiting at zero: got (%d, %v), want to scale to 1 at once", n, act)
	}
}

// TestScalesOnQueueDepth: with target_queued_requests, requests waiting
// for a replica scale a backend up though its requests in flight alone
// would not (3 in flight, target 2: 2 replicas; 12 waiting, target 4: 3);
// without it they do not count.
func TestScalesOnQueueDepth(t *testing.T) {
	queued := cfg
	queued.TargetQueued = 4
	for _, c := range []struct {
		cfg  meshspec.AutoscalingConfig
		want int
	}{{cfg, 2}, {queued, 3}} {
		p, t0 := &Policy{}, time.Unix(1000, 0)
		current := 1
		for s := range 10 {
			now := t0.Add(time.Duration(s) * time.Second)
			p.Observe(Sample{At: now, InFlight: 3, Waiting: 12}, 3*time.Second)
			if n, act := p.Decide(c.cfg, current, now); act {
				current = n
			}
		}
		if current != c.want {
			t.Errorf("target_queued_requests %v: %d replicas, want %d", c.cfg.TargetQueued, current, c.want)
		}
	}
}

// TestTheLastReplicaGoesAfterTheDownscaleToZeroDelay: with min_replicas 0
// and no load, the last replica goes after downscale_to_zero_delay_s when
// set, else after downscale_delay_s.
func TestTheLastReplicaGoesAfterTheDownscaleToZeroDelay(t *testing.T) {
	for _, c := range []struct {
		toZero float64
		want   int // the second of the decision
	}{{0, 5}, {8, 8}} {
		z := cfg
		z.MinReplicas, z.DownscaleToZeroDelayS = 0, c.toZero
		p, t0, current, decided := &Policy{}, time.Unix(1000, 0), 1, -1
		for s := range 12 {
			now := t0.Add(time.Duration(s) * time.Second)
			p.Observe(Sample{At: now}, 3*time.Second)
			if n, act := p.Decide(z, current, now); act {
				current, decided = n, s
				break
			}
		}
		if current != 0 || decided != c.want {
			t.Errorf("downscale_to_zero_delay_s %v: %d replicas at second %d, want 0 at %d", c.toZero, current, decided, c.want)
		}
	}
}
