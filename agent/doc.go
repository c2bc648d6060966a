// Package agent is servemesh's per-node agent. In the flow of
// docs/architecture.md: step 9. One runs on every node:
//
//   - It registers its node in Consul as an instance of the node's own
//     service, servemesh-node-<id> tagged servemesh-agent (with its CPUs,
//     memory and inbound listener in meta; only the node's token may write
//     that service), and heartbeats a TTL check, so the controller places
//     replicas only on live nodes (catalog.Nodes).
//   - It watches the desired state in Consul KV (meshspec.StateReader: it never writes) and
//     runs the replicas placed on its node: each gets a port ($PORT), its
//     replica tag, a log file, and restarts with exponential backoff when it
//     exits (counted in servemesh_agent_replica_restarts_total); its check
//     turns critical the moment it exits.
//   - It registers every replica in Consul's catalog as an instance of its
//     backend's service (servemesh-backend-<backend>), with a TTL check it
//     feeds from an HTTP or TCP probe: when the agent dies, its replicas go
//     critical on their own. A replica runs only if the node allows its
//     command (and where its symlinks lead), as its user with that user's
//     groups, in a 0700 folder of its own.
//   - A replica whose placement turns draining keeps serving its in-flight
//     requests for the drain period (Envoy sends it no new ones), then gets
//     SIGTERM, then SIGKILL, and is deregistered.
//   - It keeps the node's and its backends' certificates fresh for the node's
//     Envoy (agent/secrets, from Consul's service-mesh CA).
//   - Its activator (agent/activator) holds the requests the node's Envoy
//     has for a process backend with no ready replica (just created,
//     restarting, scaled to zero) until one is ready, within the
//     backend's hold_timeout_s and max_held.
//   - Its picker (agent/picker) picks which of the node's replicas of a
//     load-aware backend takes each request the node's inbound listener
//     gets (ext_proc on a unix socket in the Envoy's folder), counts each
//     replica's requests in flight and reads its server's gauges, sheds
//     sheddable requests when every replica there is saturated, and adds
//     the node's load report to each answer.
//   - The servemesh binary's agent command also supervises the node's Envoy.
//
// Each backend's replicas run as a user and group of their own from a
// range (users.go), so one backend's cannot read another's environment or
// files, and take their user_config only with a secret their agent passes
// them (reconfigure.go).
//
// Replicas outlive their agent (adopt.go): an agent that stops, crashes or
// is upgraded leaves them serving and registered, and its next incarnation
// adopts them from the records it wrote in its work folder (the process's
// pid and start time, checked against its environment), re-attaching
// probes, log rotation and registration without a restart; one whose spec
// changed meanwhile is replaced. It kills what it does not adopt (found by
// their SERVEMESH_NODE, SERVEMESH_AGENT and SERVEMESH_REPLICA_TAG
// environment). A lock in the work folder keeps two agents from adopting
// the same replicas. StopLeft (servemesh agent --stop-all) stops what an
// agent left, for a node that is being removed. Replicas write their logs
// themselves; the agent rotates them at a size cap.
//
// demoreplica is the small HTTP workload the demo and the tests run, and
// a stand-in model server (ModelServer) for the inference tests.
package agent
