// Package api is the controller's HTTP/JSON API under /v1/ and its Go client.
// In the flow of docs/architecture.md: step 1.
//
//	GET    /v1/backends                         list backends
//	POST   /v1/backends                         create a backend (a meshspec.BackendSpec)
//	GET    /v1/backends/{name}                  get one
//	PATCH  /v1/backends/{name}                  merge a JSON merge patch into its config (meshspec.ConfigPatch)
//	DELETE /v1/backends/{name}                  delete it (refused while an endpoint uses it)
//	GET    /v1/endpoints                        list endpoints
//	POST   /v1/endpoints                        create an endpoint (a meshspec.Endpoint)
//	GET    /v1/endpoints/{name}                 get one
//	PATCH  /v1/endpoints/{name}                 merge a JSON merge patch into it (not its name or rollout)
//	DELETE /v1/endpoints/{name}                 delete it
//	PUT    /v1/endpoints/{name}/traffic         set its traffic ({"traffic": {backend: weight}})
//	PUT    /v1/endpoints/{name}/shadows/{backend}  set a shadow ({"proportion": p}; 0 removes it)
//	POST   /v1/endpoints/{name}/rollout         start a rollout (a meshspec.Rollout without status)
//	GET    /v1/endpoints/{name}/rollout         its stage, live figures, thresholds and verdicts (a RolloutReport)
//	POST   /v1/endpoints/{name}/rollout/{action}  pause, resume, promote or abort it
//	GET    /v1/spec                             the declared state, one revision, as apply takes it (export)
//	POST   /v1/apply[?dry_run=true]             make the state equal a whole model
//	GET    /v1/leader                           who leads
//	GET    /v1/status                           weights next to live rates, replicas, each node's config
//	GET    /v1/xds/nodes                        which config each Envoy node holds (NodesHandler)
//	GET    /v1/prometheus/targets               the agents' metrics listeners, for Prometheus's http_sd_configs
//	GET    /v1/openapi.json                     the OpenAPI 3.1 description of all of these
//
// The routes come from one table (operations in openapi.go), from which
// both Handler and the OpenAPI description (openapi.json, rewritten by
// `go test -update`) are made; the tests check every answer against it.
// Mutations answer {"changed": bool}; repeating one answers changed=false.
// Errors answer {"error", "kind", "leader"?} with 400 (invalid), 404
// (unknown), 409 (conflict), 401 (no or wrong token), 413 (body too large),
// or 503 (not the leader, with the leader's address; or the store failed).
package api
