// Package envoy finds, starts, watches, drains and stops a node's Envoy, and
// reads it through its admin API. In the flow of docs/architecture.md:
// step 8.
//
//   - find.go: where the binary comes from (an explicit path, $SERVEMESH_ENVOY,
//     the project's tools folder, then $PATH) and its --version check.
//   - launcher.go: one node's Envoy from start to finish: render its bootstrap
//     (package bootstrap) into a work folder, then supervise it (Supervise)
//     or, in tests and benchmarks, start it and wait until ready
//     (StartReady).
//   - process.go: the child process (started with package proc: its own
//     process group; it dies with its parent unless it is the hot-restartable
//     node Envoy), output to a log file, ready when
//     /ready says LIVE, stopped by draining listeners through the admin API,
//     then SIGTERM, then SIGKILL.
//   - supervisor.go: restarts an Envoy that exits, with backoff.
//   - handover.go: a node's Envoy outlives its supervisor (an agent that
//     restarts or is upgraded); the next one adopts it, or hot restarts it
//     (--restart-epoch) when its binary, bootstrap or settings changed.
//   - parent.go: the small process that parents such an Envoy (servemesh
//     envoy-parent): with hot restart on, Envoy ends with its parent.
//   - admin.go: a small client for the admin endpoints servemesh reads
//     (/ready, /config_dump, /stats, /drain_listeners).
//
// Unit tests run a shell-script fake Envoy; the e2e tests run the real one.
package envoy
