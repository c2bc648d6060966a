// Package leader elects one controller among several with a Consul lock:
// the one that writes. In the flow of docs/architecture.md: step 2.
//
// Each controller registers itself on its Consul agent as an instance of
// the service servemesh-controller with a TTL check, and heartbeats it; its
// session is bound to that check (and the agent's serfHealth), with the release behaviour and a short lock delay. The lock
// key's value names the holder and its API address. When a leader dies
// without releasing (kill -9), its heartbeats stop, the check goes critical
// after the TTL, Consul invalidates the session and releases the key, and a
// follower blocked on the key acquires it after the lock delay. The check
// is the instance's, never the Consul node's: a node-level check gone
// critical would make every service on that node critical, replicas
// included. Instances are per incarnation: a controller restarting under the same id removes its
// predecessors' checks first, which releases their lock at once. No Consul
// error ends the election: a lost check is registered again, failed
// sessions and acquisitions are retried with backoff.
//
// Why not the Consul client's own api.Lock: its sessions are renewed on a
// session TTL of at least 10 s (a dead leader would be replaced in 10 to 20
// s, not 3 to 4); its monitor gives leadership up on any error that is not
// a 5xx (an HTTP 429 from a busy agent included), where this elector keeps
// it while the key still names its session; and followers need the holder's
// identity to name the leader, which api.Lock does not report.
package leader
