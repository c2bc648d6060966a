package translate

import (
	"math"
	"slices"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// ConnectTimeout bounds how long Envoy waits to connect to a replica.
const ConnectTimeout = time.Second

// EDSInitialFetchTimeout bounds how long a new cluster waits for its
// endpoints before it is used without them. Envoy holds later cluster
// updates behind clusters that are still warming, so a cluster whose
// endpoints never come (it was deleted while a control plane restarted)
// would stall every update for Envoy's default of 15s.
const EDSInitialFetchTimeout = 2 * time.Second

func edsConfigSource() *core.ConfigSource {
	cs := adsConfigSource()
	cs.InitialFetchTimeout = durationpb.New(EDSInitialFetchTimeout)
	return cs
}

// MinQueueLimit is the least number of requests a backend queues while its
// replicas are busy; beyond the queue, Envoy answers 503 at once.
const MinQueueLimit = 1024

// BuildClusters builds one EDS cluster per backend, sorted by name.
//
// max_concurrent_queries is enforced as in Ray Serve: a replica serves at
// most that many requests at once and further requests wait in a queue. Each
// upstream HTTP/1.1 connection carries one request at a time, so the limit
// is a per-host connection limit; requests beyond it wait in Envoy's pending
// queue (bounded by the queue limit), not fail.
func BuildClusters(m *ir.DataPlane) ([]*cluster.Cluster, error) {
	backends := sortedBackends(m)
	out := make([]*cluster.Cluster, 0, len(backends))
	for _, b := range backends {
		c := &cluster.Cluster{
			Name:                 wire.ClusterName(b.Name),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
			EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: edsConfigSource()},
			ConnectTimeout:       durationpb.New(ConnectTimeout),
			LbPolicy:             cluster.Cluster_LEAST_REQUEST,
			// Health comes from EDS, which is authoritative: never fall back
			// to sending traffic to unhealthy replicas ("panic mode").
			CommonLbConfig:  &cluster.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}},
			CircuitBreakers: circuitBreakers(b),
		}
		if b.Reach == ir.ReachDNS {
			resolveByDNS(c, b)
		}
		if err := patchCluster(b, c); err != nil {
			return nil, err
		}
		out = append(out, c)
		if b.Picker != nil {
			epp, err := endpointPickerCluster(b)
			if err != nil {
				return nil, err
			}
			out = append(out, epp)
		}
	}
	return out, nil
}

// outlierDetection ejects the hosts that keep failing, if o says so (nil:
// none).
func outlierDetection(o *ir.Outlier) *cluster.OutlierDetection {
	if o == nil {
		return nil
	}
	od := &cluster.OutlierDetection{}
	if o.Consecutive5xx > 0 {
		od.Consecutive_5Xx = wrapperspb.UInt32(uint32(o.Consecutive5xx))
	}
	if o.IntervalS > 0 {
		od.Interval = seconds(o.IntervalS)
	}
	if o.BaseEjectionS > 0 {
		od.BaseEjectionTime = seconds(o.BaseEjectionS)
	}
	if o.MaxEjectionPercent > 0 {
		od.MaxEjectionPercent = wrapperspb.UInt32(uint32(o.MaxEjectionPercent))
	}
	return od
}

// http2Options make a cluster talk HTTP/2 to its hosts: in cleartext
// (h2c) to replicas, over TLS with ALPN h2 to other nodes' inbound
// listeners.
func http2Options() map[string]*anypb.Any {
	opts, err := anypb.New(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &core.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		panic(err) // a static, valid message
	}
	return map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts}
}

// circuitBreakers limit b's requests in flight to max_concurrent_queries
// per replica, and queue the rest.
func circuitBreakers(b ir.Backend) *cluster.CircuitBreakers {
	return circuitBreakersOf(b, len(b.Replicas))
}

// circuitBreakersOf are circuitBreakers for replicas of b's replicas.
func circuitBreakersOf(b ir.Backend, replicas int) *cluster.CircuitBreakers {
	total := concurrencyLimit(b.MaxConcurrent, replicas)
	queue := queueLimit(total)
	return &cluster.CircuitBreakers{
		Thresholds: []*cluster.CircuitBreakers_Thresholds{{
			Priority:           core.RoutingPriority_DEFAULT,
			MaxConnections:     wrapperspb.UInt32(total),
			MaxPendingRequests: wrapperspb.UInt32(queue),
			MaxRequests:        wrapperspb.UInt32(saturatingAdd(total, queue)),
			// Envoy allows 3 concurrent retries per cluster by default;
			// when a replica dies, every request headed to it needs one,
			// and a request the activator holds is one.
			MaxRetries: wrapperspb.UInt32(saturatingAdd(total, queue)),
		}},
		PerHostThresholds: []*cluster.CircuitBreakers_Thresholds{{
			Priority:       core.RoutingPriority_DEFAULT,
			MaxConnections: wrapperspb.UInt32(uint32(b.MaxConcurrent)),
		}},
	}
}

// resolveByDNS makes c a STRICT_DNS cluster that lists b's serving replicas
// itself: Envoy resolves their names (IPv4 first), and serves no replica
// that is unhealthy or draining.
func resolveByDNS(c *cluster.Cluster, b ir.Backend) {
	serving := b
	serving.Replicas = nil
	for _, r := range b.Replicas {
		if r.Health == ir.Healthy {
			serving.Replicas = append(serving.Replicas, r)
		}
	}
	c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_STRICT_DNS}
	c.EdsClusterConfig = nil
	c.DnsLookupFamily = cluster.Cluster_V4_PREFERRED
	c.LoadAssignment = BuildAssignment(serving)
}

// concurrencyLimit is max_concurrent_queries × replicas, at least one
// replica's worth so a backend whose replicas are still starting is not shut.
func concurrencyLimit(maxConcurrent, replicas int) uint32 {
	limit := int64(maxConcurrent) * int64(max(replicas, 1))
	return uint32(min(limit, math.MaxUint32))
}

// queueLimit is how many requests may wait for a busy backend: ten times
// what it serves at once, at least MinQueueLimit.
func queueLimit(total uint32) uint32 {
	return max(uint32(min(uint64(total)*10, math.MaxUint32)), MinQueueLimit)
}

func saturatingAdd(a, b uint32) uint32 {
	return uint32(min(uint64(a)+uint64(b), math.MaxUint32))
}

func sortedBackends(m *ir.DataPlane) []ir.Backend {
	out := append([]ir.Backend(nil), m.Backends...)
	sortByName(out, func(b ir.Backend) string { return b.Name })
	return out
}

func sortByName[T any](items []T, name func(T) string) {
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(name(a), name(b)) })
}
