package rollout

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/meshspec"
)

// collector exports every rollout's phase and stage from the adopted
// state, and the live figures of the stages in progress, on each scrape.
type collector struct {
	r                                    *Runner
	phase, stage, requests, errRate, lat *prometheus.Desc
}

func newCollector(r *Runner) *collector {
	roles := []string{"endpoint", "role"}
	return &collector{r: r,
		phase: prometheus.NewDesc("servemesh_rollout_phase", "1 for the phase each endpoint's rollout is in (waiting, progressing, paused, promoted, rolled_back).",
			[]string{"endpoint", "candidate", "phase"}, nil),
		stage: prometheus.NewDesc("servemesh_rollout_stage", "The index of the stage each active rollout is at (0 is the first), and its candidate's share of the requests.",
			[]string{"endpoint", "candidate", "stage"}, nil),
		requests: prometheus.NewDesc("servemesh_rollout_window_requests", "Answers of the candidate and the primary in the current stage's window, over every node.", roles, nil),
		errRate:  prometheus.NewDesc("servemesh_rollout_window_error_ratio", "Share of the answers that were errors in the current stage's window.", roles, nil),
		lat:      prometheus.NewDesc("servemesh_rollout_window_latency_ms", "The checks' latency percentile in the current stage's window, in milliseconds.", roles, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.phase, c.stage, c.requests, c.errRate, c.lat} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.r.ctl.RolloutEndpoints() {
		ro := e.Rollout
		if ro.Status == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.phase, prometheus.GaugeValue, 1, e.Name, ro.Candidate, string(ro.Status.Phase))
		if stage, ok := currentStage(*ro); ok && ro.Status.Phase != meshspec.RolloutWaiting {
			ch <- prometheus.MustNewConstMetric(c.stage, prometheus.GaugeValue, float64(ro.Status.Stage), e.Name, ro.Candidate, stage.Name())
		}
	}
	for endpoint, l := range c.r.Live() {
		for role, s := range map[string]Sample{"candidate": l.Candidate, "primary": l.Primary} {
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(s.Requests), endpoint, role)
			ch <- prometheus.MustNewConstMetric(c.errRate, prometheus.GaugeValue, s.ErrorRate, endpoint, role)
			if s.Timed > 0 {
				ch <- prometheus.MustNewConstMetric(c.lat, prometheus.GaugeValue, s.LatencyMs, endpoint, role)
			}
		}
	}
}
