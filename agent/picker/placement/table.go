package placement

import (
	"container/list"
	"math"
	"slices"
	"time"
)

// Table is one backend's keys' nodes (or replicas), as one decider
// placed them: a new key goes to the first node of its order with room
// (Home), then stays where its requests went (Assign; Place does both).
// Not safe for concurrent use.
type Table struct {
	order   *list.List // of *entry, most recently used first
	at      map[string]*list.Element
	count   map[string]int   // keys, by node
	load    map[string]*load // recent requests, by node (Place)
	waiting map[string]int   // requests placed and not answered yet, by node (Place, Answered)
}

type entry struct {
	key, node string
	used      time.Time
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{order: list.New(), at: map[string]*list.Element{}, count: map[string]int{}, load: map[string]*load{}, waiting: map[string]int{}}
}

// Place is the address of the node that takes a request of key, one of
// nodes (none: ""): the key's node (Home, then Assign) or, while that node
// has had more than SpillFactor times its share of the recent requests,
// the next in the key's order that has not (the key stays placed). A key
// new here goes to its Home while that node is among those with the
// fewest requests waiting for an answer for their weight, else to the
// first such in its order, and is placed there: nothing is cached for it
// anywhere yet, so a busier node would only make it wait. The request
// then waits on the node returned until Answered.
func (t *Table) Place(key string, nodes []Node, now time.Time) string {
	if len(nodes) == 0 {
		return ""
	}
	t.expire(now)
	order := rendezvous(key, nodes)
	home := t.home(key, order)
	var out string
	if t.Placed(key, nodes) {
		t.Assign(key, home, now)
		out = t.spill(home, order, now)
	} else {
		out = t.leastWaiting(home, order)
		t.Assign(key, out, now)
	}
	t.loadOf(out, len(nodes)).value++
	t.waiting[out]++
	return out
}

// Answered ends the wait of a request Place sent to node: its answer
// began.
func (t *Table) Answered(node string) {
	if t.waiting[node] <= 1 {
		delete(t.waiting, node)
		return
	}
	t.waiting[node]--
}

// Placed reports whether key has a node among nodes: one its requests
// went to.
func (t *Table) Placed(key string, nodes []Node) bool {
	el, ok := t.at[key]
	if !ok {
		return false
	}
	node := el.Value.(*entry).node
	return slices.ContainsFunc(nodes, func(n Node) bool { return n.Addr == node })
}

// leastWaiting is home if no node of order has fewer requests waiting
// for its weight, else the first in order that has the fewest.
func (t *Table) leastWaiting(home string, order []ranked) string {
	less := func(a, b ranked) bool { // a waits less than b, for their weights
		return t.waiting[a.Addr]*max(b.Weight, 1) < t.waiting[b.Addr]*max(a.Weight, 1)
	}
	best := order[slices.IndexFunc(order, func(n ranked) bool { return n.Addr == home })]
	for _, n := range order {
		if less(n, best) {
			best = n
		}
	}
	return best.Addr
}

// Home is key's node among nodes (none: ""): its own while listed, else
// the first in its order with room for one more key.
func (t *Table) Home(key string, nodes []Node, now time.Time) string {
	if len(nodes) == 0 {
		return ""
	}
	t.expire(now)
	return t.home(key, rendezvous(key, nodes))
}

func (t *Table) home(key string, order []ranked) string {
	if el, ok := t.at[key]; ok {
		node := el.Value.(*entry).node
		for _, n := range order {
			if n.Addr == node {
				return node
			}
		}
	}
	keys, weight := 1, 0 // the new key counts
	for _, n := range order {
		keys, weight = keys+t.count[n.Addr], weight+n.Weight
	}
	for _, n := range order {
		if t.count[n.Addr] < share(keys, n.Weight, weight) {
			return n.Addr
		}
	}
	return order[0].Addr
}

// Assign makes node key's node: where its request went.
func (t *Table) Assign(key, node string, now time.Time) {
	if el, ok := t.at[key]; ok {
		if e := el.Value.(*entry); e.node == node {
			e.used = now
			t.order.MoveToFront(el)
			return
		}
		t.forget(el)
	}
	t.count[node]++
	t.at[key] = t.order.PushFront(&entry{key: key, node: node, used: now})
	for t.order.Len() > MaxKeys {
		t.forget(t.order.Back())
	}
}

// spill is home, or the first node after it in order whose recent
// requests are under its bound while home's are over.
func (t *Table) spill(home string, order []ranked, now time.Time) string {
	total, weight := 1.0, 0 // the new request counts
	for _, n := range order {
		total, weight = total+t.loadOf(n.Addr, len(order)).decayed(now), weight+n.Weight
	}
	over := func(n ranked) bool {
		return t.loadOf(n.Addr, len(order)).value+1 > SpillFactor*total*float64(n.Weight)/float64(weight)
	}
	i := slices.IndexFunc(order, func(n ranked) bool { return n.Addr == home })
	if total < spillMin || !over(order[i]) {
		return home
	}
	for _, n := range order[i+1:] {
		if !over(n) {
			return n.Addr
		}
	}
	return home
}

// Keys is how many keys each node holds.
func (t *Table) Keys() map[string]int {
	out := make(map[string]int, len(t.count))
	for n, c := range t.count {
		out[n] = c
	}
	return out
}

// expire forgets the keys unused for Idle.
func (t *Table) expire(now time.Time) {
	for el := t.order.Back(); el != nil && now.Sub(el.Value.(*entry).used) > Idle; el = t.order.Back() {
		t.forget(el)
	}
}

func (t *Table) forget(el *list.Element) {
	e := el.Value.(*entry)
	if t.count[e.node]--; t.count[e.node] <= 0 {
		delete(t.count, e.node)
	}
	delete(t.at, e.key)
	t.order.Remove(el)
}

// SpillFactor is how far above its share of the recent requests a node
// may be before a key's requests spill to the key's next node; and
// spillMin, the recent requests below which none spill (too few to say).
const (
	SpillFactor = 1.5
	spillMin    = 10.0
)

// loadDecay is the time constant of a node's recent requests.
const loadDecay = 2 * time.Second

// load is a count of requests decaying with loadDecay.
type load struct {
	value float64
	at    time.Time
}

func (l *load) decayed(now time.Time) float64 {
	if !l.at.IsZero() {
		l.value *= math.Exp(-now.Sub(l.at).Seconds() / loadDecay.Seconds())
	}
	l.at = now
	return l.value
}

func (t *Table) loadOf(addr string, nodes int) *load {
	l, ok := t.load[addr]
	if !ok {
		if len(t.load) > 4*nodes+16 { // nodes gone: start over
			t.load = map[string]*load{}
		}
		l = &load{}
		t.load[addr] = l
	}
	return l
}

// Entry is one key's placement: its node and when it was last used.
type Entry struct {
	Key  string    `json:"key"`
	Node string    `json:"node"`
	Used time.Time `json:"used"`
}

// Entries are the table's placements, most recently used first (a
// picker's checkpoint).
func (t *Table) Entries() []Entry {
	out := make([]Entry, 0, t.order.Len())
	for el := t.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		out = append(out, Entry{Key: e.key, Node: e.node, Used: e.used})
	}
	return out
}

// Restore places entries, most recently used first, as Entries gave
// them: each stays on its node, used when it was (those idle past Idle
// go at the next use, as others; at most MaxKeys are kept).
func (t *Table) Restore(entries []Entry) {
	for i := len(entries) - 1; i >= 0; i-- {
		if e := entries[i]; e.Key != "" && e.Node != "" {
			t.Assign(e.Key, e.Node, e.Used)
		}
	}
}
