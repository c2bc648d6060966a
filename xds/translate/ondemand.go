package translate

import (
	"fmt"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ondemand "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/on_demand/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Clusters on demand (wire.ProxyNode.ClustersOnDemand). A node that asks
// for them holds every route but, of the backends' clusters, only those it
// was sent: the xDS server starts it with its own (the backends it runs,
// the agent's services) and adds the clusters of an endpoint once the
// node's Envoy names one of them. Envoy names a cluster from this filter:
// a request whose route sends to a cluster the node does not hold waits
// here while Envoy asks the control plane for it over the node's ADS
// stream (delta xDS: Envoy's on-demand cluster discovery), then goes on.
// A request that waits longer than OnDemandClusterTimeout is answered as
// for a missing cluster (503).

// onDemandFilter is the name of Envoy's on-demand filter in a chain.
const onDemandFilter = "envoy.filters.http.on_demand"

// OnDemandClusterTimeout bounds how long a request waits for the cluster
// its route sends to when its node does not hold it yet.
const OnDemandClusterTimeout = 5 * time.Second

// onDemandClusters is the on-demand filter of a node whose clusters come
// on demand: it asks for the cluster a request's route chose over ADS.
// Nodes that hold every cluster do not have it.
func onDemandClusters(in filterInput) (*hcm.HttpFilter, error) {
	if !in.onDemand {
		return nil, nil
	}
	cfg := &ondemand.OnDemand{Odcds: &ondemand.OnDemandCds{
		Source: &core.ConfigSource{
			ResourceApiVersion:    core.ApiVersion_V3,
			ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		},
		Timeout: durationpb.New(OnDemandClusterTimeout),
	}}
	packed, err := anypb.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("pack on-demand filter: %w", err)
	}
	return &hcm.HttpFilter{Name: onDemandFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: packed}}, nil
}
