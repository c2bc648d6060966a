// Package translate turns the data plane's IR (an ir.DataPlane, which
// ir.Lower made and validated from the view) plus one node's listener
// settings into Envoy resources. It reads no user type and trusts the IR:
// it validates nothing and applies no default. It is a pure function: the
// same input gives the same, deterministically ordered output, and nothing is
// read from or written to the outside world. In the flow of
// docs/architecture.md: step 6.
//
// One small builder per resource kind:
//
//   - listener.go: the node's public HTTP listener (routed endpoints, by
//     first path segment: publicroutes.go) and its loopback mesh listener
//     (every endpoint, by Host header: scoped RDS picks the endpoint's own
//     route configuration).
//   - publicroutes.go: the public listener's scopes, one per first path
//     segment of the routed endpoints, the early header mutation that
//     keys a request by its segment, the filter that falls back to the
//     root's routes, and each scope's route configuration.
//   - local.go (mesh mTLS): same-node calls: a node's view of a backend
//     it runs replicas of, its own replicas on loopback without TLS and
//     the other nodes by their inbound listeners.
//   - mtls.go and inbound.go (mesh mTLS): ForNode builds the node's inbound
//     listener (one filter chain per backend it runs, chosen by SNI, a
//     node's certificate required) and its _inbound_<backend> clusters of
//     its own replicas; with the listeners, the only node-dependent
//     resources. Shared gives backend clusters the calling node's identity
//     from wire.SecretsDir, a path relative to each node's Envoy, so they
//     stay shared.
//   - route.go: the public route configurations (path matches, longest
//     first) and each endpoint's mesh one with its scope; method checks with 405 + Allow, weighted
//     clusters, request-mirror policies for shadows.
//   - weights.go: traffic weights to integer parts per million.
//   - cluster.go: one EDS cluster per backend with circuit breakers.
//   - assignment.go: one ClusterLoadAssignment per backend listing its
//     replicas with their health (what Envoy calls endpoints; in servemesh an
//     endpoint is always servemesh's endpoint, a route).
//   - activator.go: every assignment's last, lowest priority, the node's
//     activator (agent/activator), which holds a backend's requests while
//     none of its replicas can take them.
//   - inference.go: model traffic: routes by the model a JSON body names
//     (json_to_metadata, then a route re-match), the criticality header of
//     sheddable endpoints, and for load-aware backends client-side weighted
//     round robin over nodes by their load reports and, on the inbound
//     listener, the node's picker (ext_proc) and the override_host policy
//     that follows it.
//   - modellist.go: a model-routed endpoint's model list, as OpenAI's
//     clients ask for it (GET <base>/models), in its route key's table.
//   - features.go: features, registered in one table per resource they
//     change, each an implementation of that table's interface:
//     backendFeatures (grpc, outlier, load_aware) change a backend's
//     clusters and how its nodes call it; routeFeatures (retry,
//     criticality) an endpoint's forwarding routes; managerFeatures (the
//     access log) every connection manager of a node. Translation asks the
//     features a backend, endpoint or node uses at each resource; an
//     endpoint's router (route.go: endpointRouter) routes its requests by
//     its split or, with model_routing, by the model its body names.
//   - filters.go: the one ordered table of every HTTP filter on every
//     listener (outbound: public and mesh; inbound: per backend), each row
//     with the chains it is on and why it sits where it does; a feature
//     that filters requests adds a row there.
//   - callerpicker.go: the outbound filter that asks the calling node's
//     picker (prompt affinity's key and node, a model's rewrite), off but
//     on the routes that need it.
//   - endpointpicker.go: backends' external pickers (the Endpoint Picker
//     Protocol): the outbound filters that ask a backend's picker and
//     follow its answer (off but on its routes, or its share of a split),
//     its cluster, and the clusters that send to the replica it named.
//   - ratelimit.go: endpoints' local rate limits (the outbound filter and
//     each route's bucket); globalratelimit.go: their global limits (the
//     filters that ask the node's rate limit service, one per failure
//     mode, and the descriptors each route sends), and token quotas;
//     usage.go: the filter that reads each answer's token usage for them.
//   - tracing.go: the mesh's collector's cluster and each connection
//     manager's tracer.
//   - ondemand.go: clusters on demand, for nodes that ask for them.
//   - accesslog.go: the JSON access log of every HTTP listener.
//   - limits.go: what one client may make a listener hold (buffers, HTTP/2
//     streams and windows, header timeouts); the node's overload manager
//     is the bootstrap's.
//   - translate.go: Translate, the whole of one node's resources at once
//     (the reference the builder is tested against), and which
//     assignments a node's clusters ask for.
//   - builder.go: Builder, the same translation done again at every change
//     for only what changed: a backend's clusters and assignments depend on
//     the backend alone and an endpoint's routes on the endpoint alone, so
//     each is rebuilt (and hashed) only when it changed, and a node's own
//     resources only when its listener settings or the backends it runs
//     changed. Shared and ForNode stay the reference it is tested against.
//     The backends a build rebuilds, and the nodes ForNodes builds, are
//     built in parallel (internal/parallel), and inbound.go builds an
//     inbound chain once for the nodes of one ForNodes that have it alike
//     (sharedChains). nodebuilder.go builds a node's own resources
//     (Builder.ForNode); routepatch.go puts the routes of the endpoints a
//     change rebuilt in the last build's list when nothing else about the
//     routes changed, rather than assembling every endpoint's again;
//     changes.go is the change set a build declares
//     (ChangeSet, by kind and name), by which the xDS server sends the
//     assignments that changed; encoded.go holds a resource as its encoding (Encoded),
//     proto.Marshal of the built message, so what is sent is a copy.
//     Every resource is encoded from its whole message: nothing is framed
//     or patched byte by byte (issue 61 measured each such trick on one
//     change, and none saved 10%).
//     The parts are entries of the one cache (xds/cache: KindBackendParts,
//     KindEndpointParts, KindRouteTable, KindNodeParts), which the xDS
//     server shares. Off (Uncached; the server's CacheOff,
//     $SERVEMESH_XDS_CACHE=off) the builder reuses none of them: every
//     build is whole, and what changed is decided by comparing versions
//     with each entry's last value; cache_test.go holds the two to the
//     same output, byte for byte.
//
// Resource and stat names come from package wire, which the agent also
// reads them with.
package translate
