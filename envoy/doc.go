// Package envoy finds, starts, watches, drains and stops a node's Envoy, and
// reads it through its admin API.
//
//   - find.go: where the binary comes from (an explicit path, $SERVEMESH_ENVOY,
//     the project's tools folder, then $PATH) and its --version check.
//   - process.go: the child process: explicit arguments, dies with its parent
//     (Pdeathsig), output to a log file, ready when /ready says LIVE, stopped
//     by draining listeners through the admin API, then SIGTERM, then SIGKILL.
//   - admin.go: a small client for the admin endpoints servemesh reads
//     (/ready, /config_dump, /stats, /drain_listeners).
//
// Unit tests run a shell-script fake Envoy; the e2e tests run the real one.
package envoy
