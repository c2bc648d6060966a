package placement

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func twoNodes() []Node { return []Node{{"10.0.0.1:21000", 2}, {"10.0.0.2:21000", 2}} }

// placeThrice sends each key's requests three times, 100 ms apart, and
// returns where each key's last went.
func placeThrice(m *Table, keys []string, nodes []Node, at time.Time) map[string]string {
	out := map[string]string{}
	for round := range 3 {
		for i, k := range keys {
			out[k] = m.Place(k, nodes, at.Add(time.Duration(round)*time.Second+time.Duration(i)*100*time.Millisecond))
		}
	}
	return out
}

// TestKeysSpreadAsTheNodesCanHoldThem: twelve keys over two nodes of two
// replicas each end six and six, whatever the keys (a plain hash leaves
// one node eight or more a time in two); each keeps its node.
func TestKeysSpreadAsTheNodesCanHoldThem(t *testing.T) {
	for run := range 20 {
		m, nodes := NewTable(), twoNodes()
		var keys []string
		for i := range 12 {
			keys = append(keys, fmt.Sprintf("run %d tenant %d", run, i))
		}
		placed := placeThrice(m, keys, nodes, t0)
		count := map[string]int{}
		for _, n := range placed {
			count[n]++
		}
		if count[nodes[0].Addr] != 6 || count[nodes[1].Addr] != 6 || m.Keys()[nodes[0].Addr] != 6 {
			t.Fatalf("run %d: requests' nodes %v, keys by node %v: want 6 and 6", run, count, m.Keys())
		}
		for k, n := range placed {
			if got := m.Place(k, nodes, t0.Add(time.Minute)); got != n {
				t.Fatalf("run %d: %q moved from %s to %s", run, k, n, got)
			}
		}
	}
}

// TestSharesFollowReplicas: a node with three replicas beside one with
// one takes three keys in four; two callers that see the keys in the
// same order place each alike.
func TestSharesFollowReplicas(t *testing.T) {
	nodes := []Node{{"10.0.0.1:21000", 3}, {"10.0.0.2:21000", 1}}
	a, b := NewTable(), NewTable()
	for i := range 40 {
		k := fmt.Sprint("key ", i)
		at := t0.Add(time.Duration(i) * time.Second)
		if na, nb := a.Place(k, nodes, at), b.Place(k, nodes, at); na != nb {
			t.Fatalf("%q: one caller placed it on %s, the other on %s", k, na, nb)
		}
	}
	if k := a.Keys(); k[nodes[0].Addr] != 30 || k[nodes[1].Addr] != 10 {
		t.Fatalf("keys by node %v, want 30 and 10", k)
	}
}

// TestANodeLeavingMovesOnlyItsKeys: after a node leaves, its keys go to
// the others, whose keys stay.
func TestANodeLeavingMovesOnlyItsKeys(t *testing.T) {
	m := NewTable()
	nodes := []Node{{"10.0.0.1:21000", 1}, {"10.0.0.2:21000", 1}, {"10.0.0.3:21000", 1}}
	var keys []string
	for i := range 30 {
		keys = append(keys, fmt.Sprint("key ", i))
	}
	before := placeThrice(m, keys, nodes, t0)
	after := placeThrice(m, keys, nodes[:2], t0.Add(time.Minute))
	moved := 0
	for _, k := range keys {
		if after[k] == nodes[2].Addr {
			t.Fatalf("%q still on %s, which left", k, after[k])
		}
		if before[k] != nodes[2].Addr && after[k] != before[k] {
			moved++
		}
	}
	if moved > 0 {
		t.Fatalf("%d keys of the nodes that stayed moved", moved)
	}
}

// TestIdleAndOldKeysAreForgotten: keys unused for Idle go, and beyond
// MaxKeys the least recently used.
func TestIdleAndOldKeysAreForgotten(t *testing.T) {
	m, nodes := NewTable(), twoNodes()
	for i := range 4 {
		m.Place(fmt.Sprint("old ", i), nodes, t0)
	}
	m.Place("new", nodes, t0.Add(Idle+time.Second))
	if m.order.Len() != 1 || len(m.at) != 1 {
		t.Fatalf("%d keys after the old ones idled, want the new one alone", m.order.Len())
	}
	for i := range MaxKeys + 100 {
		m.Place(fmt.Sprint("key ", i), nodes, t0.Add(Idle+2*time.Second))
	}
	if m.order.Len() != MaxKeys || len(m.at) != MaxKeys {
		t.Fatalf("%d keys listed, %d indexed: want %d", m.order.Len(), len(m.at), MaxKeys)
	}
}

// TestAHotKeySpills: one key's requests, many at once, go to its node
// until that node has had SpillFactor times its share of the recent
// requests, then to the other; requests of a key at one a second never
// spill.
func TestAHotKeySpills(t *testing.T) {
	m, nodes := NewTable(), twoNodes()
	home := m.Place("hot", nodes, t0)
	other := nodes[0].Addr
	if other == home {
		other = nodes[1].Addr
	}
	sent := map[string]int{home: 1}
	for i := range 99 {
		sent[m.Place("hot", nodes, t0.Add(time.Duration(i)*time.Millisecond))]++
	}
	if sent[other] == 0 || sent[home] < 2*sent[other] {
		t.Fatalf("a hot key's 100 requests: %v; want most at its node %s, some spilled to %s", sent, home, other)
	}
	m = NewTable()
	home = m.Place("cold", nodes, t0)
	for i := range 50 {
		if got := m.Place("cold", nodes, t0.Add(time.Duration(i+1)*time.Second)); got != home {
			t.Fatalf("request %d of a key at one a second went to %s, not its node %s", i, got, home)
		}
	}
}

// TestNoNodes: nothing to place on.
func TestNoNodes(t *testing.T) {
	if NewTable().Place("k", nil, t0) != "" || NewTable().Home("k", nil, t0) != "" {
		t.Fatal("placed with no nodes")
	}
}

// TestTableSpreadsNewKeys: new keys, each assigned where Home says, end
// as many on each replica; a key then stays where it was assigned, even
// elsewhere than its home (the picker sent it by load).
func TestTableSpreadsNewKeys(t *testing.T) {
	replicas := []Node{{"a#1", 1}, {"a#2", 1}, {"a#3", 1}}
	for run := range 20 {
		tab := NewTable()
		for i := range 9 {
			k := fmt.Sprintf("run %d prefix %d", run, i)
			tab.Assign(k, tab.Home(k, replicas, t0), t0)
		}
		if k := tab.Keys(); k["a#1"] != 3 || k["a#2"] != 3 || k["a#3"] != 3 {
			t.Fatalf("run %d: keys by replica %v, want 3 each", run, k)
		}
	}
	tab := NewTable()
	tab.Assign("k", "a#2", t0)
	if got := tab.Home("k", replicas, t0); got != "a#2" {
		t.Fatalf("a key assigned to a#2 has its home at %s", got)
	}
	if got := tab.Home("k", replicas[:1], t0); got != "a#1" {
		t.Fatalf("a key whose replica is gone has its home at %s, want a#1", got)
	}
}

// TestANewKeyGoesWhereFewestWait: a key new to the table goes to its
// home while no node has fewer requests waiting for an answer (for its
// weight), else to the node with the fewest (the benchmark's unshared
// prompts waited behind each other's prefills on one engine while the
// other was idle: placed by how many keys each node held). A placed key
// stays on its node however many wait there (below the spill), and an
// answered request no longer counts.
func TestANewKeyGoesWhereFewestWait(t *testing.T) {
	nodes := twoNodes()
	tab := NewTable()
	first := tab.Place("k0", nodes, t0) // waiting: first 1, other 0
	other := nodes[0].Addr
	if other == first {
		other = nodes[1].Addr
	}
	for i := range 20 {
		k := fmt.Sprintf("k%d", i+1)
		if got := tab.Place(k, nodes, t0); got != other {
			t.Fatalf("new key %s with one request waiting on %s and none on %s went to %s", k, first, other, got)
		}
		tab.Answered(other)
	}
	if got := tab.Place("k0", nodes, t0); got != first {
		t.Fatalf("a placed key went to %s, not its node %s, for the requests waiting there", got, first)
	}
	tab.Answered(first)
	tab.Answered(first)
	tab.Answered(first) // more answers than requests: none wait
	// No request waits anywhere: a new key goes to its home, the one the
	// keys' counts give (other, holding one key fewer).
	if got := tab.Place("fresh", nodes, t0); got != first {
		t.Fatalf("with none waiting, a new key went to %s; want its home %s (the node with fewer keys)", got, first)
	}

	// Weights: a node of two replicas with one waiting waits less, for
	// its weight, than one of one replica with one waiting.
	weighted := []Node{{"big", 2}, {"small", 1}}
	tab = NewTable()
	tab.waiting["big"], tab.waiting["small"] = 1, 1
	for i := range 20 {
		if got := tab.Place(fmt.Sprintf("w%d", i), weighted, t0); got != "big" {
			t.Fatalf("new key w%d went to %s; want big (1 waiting of 2 replicas against 1 of 1)", i, got)
		}
		tab.Answered("big")
	}
}
