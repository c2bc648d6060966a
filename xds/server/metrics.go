package server

import (
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the xDS server's Prometheus series.
type metrics struct {
	pushes       *prometheus.CounterVec
	nacks        *prometheus.CounterVec
	streams      prometheus.Gauge
	publishes    prometheus.Counter
	publishTime  prometheus.Histogram
	rejected     prometheus.Counter
	knownNodes   prometheus.Gauge
	modelVersion prometheus.Gauge
	connected    prometheus.Gauge
	convergence  prometheus.Histogram
}

// newMetrics makes the server's series; outOfSync counts the connected
// nodes that do not hold the latest model's configuration (read at scrape
// time).
func newMetrics(reg prometheus.Registerer, outOfSync func() float64) *metrics {
	m := &metrics{
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "servemesh_xds_pushes_total",
			Help: "xDS responses sent to Envoy nodes, by resource type.",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "servemesh_xds_nacks_total",
			Help: "xDS responses Envoy rejected (NACKed), by resource type.",
		}, []string{"type"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_xds_streams",
			Help: "Open xDS streams from Envoy nodes.",
		}),
		publishes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "servemesh_xds_snapshot_publishes_total",
			Help: "Times the desired state was translated and published to the caches.",
		}),
		publishTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "servemesh_xds_snapshot_publish_seconds",
			Help:    "Time to translate the desired state and publish it for every node.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "servemesh_xds_rejected_models_total",
			Help: "Models refused because they failed validation; the last good model kept serving.",
		}),
		knownNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_xds_nodes",
			Help: "Envoy nodes the server builds configuration for.",
		}),
		modelVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_xds_model_generation",
			Help: "Generation of the last accepted model (increments on every accepted change).",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "servemesh_xds_connected_nodes",
			Help: "Envoy nodes with at least one open xDS stream.",
		}),
		convergence: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "servemesh_xds_convergence_seconds",
			Help:    "Time from an accepted change to a node ACKing the configuration built from it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
	}
	// Every type's series exists from the start at 0, so rate() and
	// increase() of a type with no push or NACK yet read 0, not nothing.
	for _, typ := range []string{resource.ListenerType, resource.RouteType, resource.ScopedRouteType, resource.ClusterType, resource.EndpointType} {
		m.pushes.WithLabelValues(shortType(typ))
		m.nacks.WithLabelValues(shortType(typ))
	}
	if reg != nil {
		reg.MustRegister(m.pushes, m.nacks, m.streams, m.publishes, m.publishTime, m.rejected, m.knownNodes, m.modelVersion,
			m.connected, m.convergence, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "servemesh_xds_nodes_out_of_sync",
				Help: "Connected Envoy nodes that have not ACKed the configuration of the latest accepted model (briefly after every change; for long, a node that cannot follow).",
			}, outOfSync),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "servemesh_xds_large_answer_bytes",
				Help: "Bytes of large xDS answers (over 1 MiB) made and not yet written to their streams, at most 64 MiB (LargeAnswersBudget); at the limit, more wait.",
			}, func() float64 { return float64(answers.held.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "servemesh_xds_large_answers_waited_out_total",
				Help: "Large xDS answers sent without room after waiting 10 s for it: nodes that do not read their answers hold the room.",
			}, func() float64 { return float64(answers.waitedOut.Load()) }))
	}
	return m
}
