// Package placement places requests' affinity keys (a conversation, a
// model, a prompt's prefix) on a backend's nodes, or on a node's
// replicas, so that each holds about its share of the keys: as many as
// its caches can hold, where a plain hash of twelve keys over two nodes
// leaves one with eight or more a time in two, and its replicas thrash.
// Each key has its own order of the nodes (weighted rendezvous hashing:
// a node comes first for keys in proportion to its weight, and one
// leaving moves only its own keys); a node's share of the keys is its
// part of the weights, rounded up (consistent hashing with bounded loads,
// Mirrokni, Thorup and Zadimoghaddam, 2018, over keys rather than
// requests).
//
// A key stays on its node while the node is listed and the key used
// (Idle), so a conversation or a tenant's prompt keeps the cache it
// warmed: each decider places the keys it sees itself, first come first
// placed. The calling nodes each decide alone (Table.Place): two that see
// the same keys in the same order place them alike, and they differ only
// on a key that found its first node full in one and not in the other,
// or busier (a new key goes where the fewest of the caller's requests
// wait for an answer, when its first node is not among those).
// (A placement that depends on the set of keys alone would have every
// caller agree, but must move placed keys as keys come and go: a cache
// lost for each, which multi-turn chats pay most.) A hot key's requests
// spill to its next node while its own node has had more than
// SpillFactor times its share of the recent requests. A node's picker
// places prompts over its own replicas (Table.Home, then Assign where the
// request went: it weighs load itself).
//
// Pure: no clock (callers pass the time) and no I/O; the picker holds
// them under its lock. Off the flow of docs/architecture.md, a part of
// step 9's picker.
package placement

import (
	"cmp"
	"hash/fnv"
	"math"
	"slices"
	"time"
)

// Node is a node (or a replica) that may take keys: its address and its
// weight (its replicas of the backend; a replica's is 1).
type Node struct {
	Addr   string
	Weight int
}

// MaxKeys bounds the keys a placement remembers, least recently used
// forgotten first: 16,384 per backend, about 2 MB.
const MaxKeys = 16384

// Idle is how long a key unused keeps its node: then it is forgotten, and
// its node's share is free for others.
const Idle = 10 * time.Minute

// share is how many of keys a node of weight w of total may hold: its
// part, rounded up (so the shares add up to keys or more).
func share(keys, w, total int) int {
	return int(math.Ceil(float64(keys) * float64(w) / float64(max(total, 1))))
}

// ranked is a node in a key's order, with its score for the key.
type ranked struct {
	Node
	score float64
}

// rendezvous orders nodes for key: by weighted rendezvous hashing,
// highest -weight/ln(u) first, u the key's and the node's hash in (0, 1).
func rendezvous(key string, nodes []Node) []ranked {
	s := make([]ranked, 0, len(nodes))
	for _, n := range nodes {
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(n.Addr))
		u := (float64(mix(h.Sum64())>>11) + 0.5) / (1 << 53)
		s = append(s, ranked{n, -float64(max(n.Weight, 1)) / math.Log(u)})
	}
	slices.SortFunc(s, func(a, b ranked) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.Addr, b.Addr)
	})
	return s
}

// mix is a 64-bit finalizer (SplitMix64's): FNV's low bits alone spread
// short keys poorly.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
