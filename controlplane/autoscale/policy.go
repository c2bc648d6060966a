package autoscale

import (
	"math"
	"time"

	"github.com/servemesh/servemesh/meshspec"
)

// Sample is one reading of a backend's requests in flight, and of those
// waiting for a replica of a load-aware backend, summed over nodes.
type Sample struct {
	At       time.Time
	InFlight float64
	Waiting  float64
}

// Policy decides one backend's replica count.
type Policy struct {
	samples []Sample
	// wantSince is when the current wish to scale (direction want) began.
	want      int
	wantSince time.Time
}

// Observe records a sample and forgets those older than the look-back period.
func (p *Policy) Observe(s Sample, lookBack time.Duration) {
	p.samples = append(p.samples, s)
	cut := 0
	for cut < len(p.samples) && s.At.Sub(p.samples[cut].At) > lookBack {
		cut++
	}
	p.samples = p.samples[cut:]
}

// latest is the newest sample's in-flight count, 0 with none.
func (p *Policy) latest() float64 {
	if len(p.samples) == 0 {
		return 0
	}
	return p.samples[len(p.samples)-1].InFlight
}

// Average is the mean in-flight count over the samples kept.
func (p *Policy) Average() float64 { return p.mean(func(s Sample) float64 { return s.InFlight }) }

// AverageWaiting is the mean count of requests waiting over the samples
// kept.
func (p *Policy) AverageWaiting() float64 { return p.mean(func(s Sample) float64 { return s.Waiting }) }

// mean is the mean of figure over the samples kept, 0 with none.
func (p *Policy) mean(figure func(Sample) float64) float64 {
	if len(p.samples) == 0 {
		return 0
	}
	sum := 0.0
	for _, s := range p.samples {
		sum += figure(s)
	}
	return sum / float64(len(p.samples))
}

// Decide returns the replica count to scale to, and whether to act now:
// enough replicas that each carries target_in_flight_requests on
// average, and, with target_queued_requests, that at most that many
// wait per replica (KEDA's queue-length scaling), whichever needs more.
func (p *Policy) Decide(cfg meshspec.AutoscalingConfig, current int, now time.Time) (int, bool) {
	cfg = cfg.Effective()
	desired := int(math.Ceil(p.Average() / cfg.TargetInFlight))
	if cfg.TargetQueued > 0 {
		desired = max(desired, int(math.Ceil(p.AverageWaiting()/cfg.TargetQueued)))
	}
	desired = min(max(desired, cfg.MinReplicas), cfg.MaxReplicas)
	if current == 0 && p.latest() > 0 {
		// Scaled to zero, and a request waits in a node's activator: wake
		// now, without the upscale delay, as Knative's activator pokes its
		// autoscaler.
		p.want = 0
		return max(desired, 1), true
	}
	direction := 0
	switch {
	case desired > current:
		direction = 1
	case desired < current:
		direction = -1
	}
	if direction == 0 {
		p.want = 0
		return current, false
	}
	if p.want != direction {
		p.want, p.wantSince = direction, now
	}
	delay := cfg.UpscaleDelayS
	switch {
	case direction < 0 && desired == 0:
		delay = cfg.DownscaleToZeroDelayS
	case direction < 0:
		delay = cfg.DownscaleDelayS
	}
	if now.Sub(p.wantSince) < time.Duration(delay*float64(time.Second)) {
		return current, false
	}
	p.want = 0
	return desired, true
}
