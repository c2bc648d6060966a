// Package leader elects one controller among several with a Consul lock.
//
// Each controller registers a TTL health check on its Consul agent and
// heartbeats it; its session is bound to that check (and the agent's
// serfHealth), with the release behaviour and a short lock delay. The lock
// key's value names the holder and its API address. When a leader dies
// without releasing (kill -9), its heartbeats stop, the check goes critical
// after the TTL, Consul invalidates the session and releases the key, and a
// follower blocked on the key acquires it after the lock delay. Checks are
// per incarnation: a controller restarting under the same id removes its
// predecessors' checks first, which releases their lock at once.
package leader
