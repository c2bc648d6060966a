// Package ratelimit runs a node's rate limit service, the backend of the
// endpoints' global rate limits (meshspec.GlobalRateLimit): Envoy's own,
// envoyproxy/ratelimit, counting in a Redis that every node's service
// shares, so a limit holds across the mesh. In the flow of
// docs/architecture.md: step 9.
//
// It owns three things: the service's configuration, rendered from the
// desired state (Config: one descriptor per endpoint with a global limit,
// nested by the header or client address it counts by, under
// wire.RateLimitDomain, the keys xds/translate's routes send); the
// service's process (Service: started detached on wire.RateLimitSocket in
// the Envoy's folder, so an agent's restart leaves it serving and the next
// agent adopts it, restarted with backoff when it exits, its configuration
// rewritten when the desired state changes, which it reloads); and its
// figures (Service.Report, read from its metrics on loopback: the requests
// it refused, by endpoint, and the limits of the configuration it has
// loaded, which the controller's served report compares with the stored
// endpoints', so that --wait returns once every node counts a new limit).
//
// The Redis password reaches the service alone, in its environment; the
// agent never logs it and replicas never see it.
package ratelimit
