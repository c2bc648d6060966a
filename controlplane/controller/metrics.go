package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	operations *prometheus.CounterVec
	opLatency  *prometheus.HistogramVec
	checkpoint prometheus.Histogram
	leader     prometheus.Gauge
	unreadable prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "servemesh_controller_operations_total",
			Help: "State-changing operations, by operation and result (ok, unchanged, or the error kind).",
		}, []string{"op", "result"}),
		opLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "servemesh_controller_operation_seconds",
			Help:    "Time to validate, checkpoint and publish an operation.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"op"}),
		checkpoint: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "servemesh_controller_checkpoint_seconds",
			Help:    "Time to write one checkpoint to the store.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_controller_leader",
			Help: "1 while this controller is the leader.",
		}),
		unreadable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_store_unreadable_keys",
			Help: "Keys under the state's prefix that the last load left out (unknown, malformed, another schema); see servemesh status.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.operations, m.opLatency, m.checkpoint, m.leader, m.unreadable)
	}
	return m
}

func (m *metrics) observe(op string, changed bool, err error, took time.Duration) {
	result := "ok"
	switch {
	case err != nil:
		result = kindName(KindOf(err))
	case !changed:
		result = "unchanged"
	}
	m.operations.WithLabelValues(op, result).Inc()
	m.opLatency.WithLabelValues(op).Observe(took.Seconds())
}

func kindName(k Kind) string {
	switch k {
	case Invalid:
		return "invalid"
	case NotFound:
		return "not_found"
	case Conflict:
		return "conflict"
	case NotLeader:
		return "not_leader"
	case Unavailable:
		return "unavailable"
	}
	return "error"
}
