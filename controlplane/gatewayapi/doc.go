// Package gatewayapi reads Kubernetes Gateway API HTTPRoute resources
// (gateway.networking.k8s.io/v1) into servemesh endpoints, so that routes
// written for Envoy Gateway, Istio or Contour can be applied as they are
// (`servemesh apply -f`). What servemesh cannot do is refused by name, with
// what to write instead; nothing is silently ignored. It owns no state. In
// the flow of docs/architecture.md: step 1 (before the config file reaches
// the API).
//
// One HTTPRoute is one endpoint, named by metadata.name:
//   - the rule without header matches is the endpoint's split: its path
//     prefix is the endpoint's route, its methods the endpoint's (none: any
//     method), its backendRefs' weights the traffic, its RequestMirror
//     filters the shadows (percent, or fraction), its timeouts the
//     endpoint's (request: timeout_s, backendRequest: per_try_timeout_s);
//   - each rule whose matches test one header (Exact or RegularExpression)
//     on the same path sends them to its one backendRef: a match rule;
//   - parentRefs name the Gateway: in servemesh, every node's public
//     listener (and the mesh listener, by the endpoint's name).
package gatewayapi
