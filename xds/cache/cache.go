package cache

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
)

// Key names an entry.
type Key struct {
	// Kind is what the entry is (the package that puts it declares its
	// kinds as constants, each a row of the architecture doc's table).
	Kind string `json:"kind"`
	// Name is which one, unique within its kind.
	Name string `json:"name"`
	// Version is the version of the inputs the entry was made from: a
	// Get hits only an entry of the same version. Empty for an entry
	// whose reader compares its inputs itself (it holds them).
	Version string `json:"version,omitempty"`
}

// Mode says whether a cache reuses what it holds.
type Mode bool

const (
	// On makes Get return what was put under the same key.
	On Mode = true
	// Off makes Get never hit ($SERVEMESH_XDS_CACHE=off): the switch for a
	// suspected cache fault, and the oracle the cache is tested against.
	Off Mode = false
)

// Cache holds entries by kind and name, one version of each.
type Cache struct {
	on bool
	mu sync.RWMutex
	by map[string]*kindEntries
	// epoch counts rounds (NextEpoch); an entry records the round it
	// was last got or put in, so DropUnused can tell.
	epoch atomic.Uint64
}

// kindEntries are one kind's entries, and how its Gets went (the debug
// view's counts).
type kindEntries struct {
	names        map[string]*entry
	hits, misses atomic.Uint64
}

type entry struct {
	version string
	value   any
	used    atomic.Uint64 // the epoch it was last got or put in
}

// New returns an empty cache.
func New(mode Mode) *Cache {
	return &Cache{on: bool(mode), by: map[string]*kindEntries{}}
}

// On reports whether c reuses what it holds.
func (c *Cache) On() bool { return c.on }

// kindLocked is kind's entries, made if c has none yet; c.mu is held for
// writing.
func (c *Cache) kindLocked(kind string) *kindEntries {
	k := c.by[kind]
	if k == nil {
		k = &kindEntries{names: map[string]*entry{}}
		c.by[kind] = k
	}
	return k
}

// Clear drops the entries of kind named in names (a declared change), or
// every entry of kind when names is empty.
func (c *Cache) Clear(kind string, names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.by[kind]
	if k == nil {
		return
	}
	if len(names) == 0 {
		clear(k.names)
		return
	}
	for _, n := range names {
		delete(k.names, n)
	}
}

// Retain keeps the entries of kind for which keep is true and drops the
// rest: what the inputs no longer have (orphans, decided from the
// inputs).
func (c *Cache) Retain(kind string, keep func(name string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := c.by[kind]; k != nil {
		for n := range k.names {
			if !keep(n) {
				delete(k.names, n)
			}
		}
	}
}

// NextEpoch starts a round of use: DropUnused then drops what was not
// got or put since.
func (c *Cache) NextEpoch() { c.epoch.Add(1) }

// DropUnused drops the entries of kind neither got (a hit) nor put since
// the last NextEpoch: what a whole round of use, which asks for every
// entry it still needs, no longer asked for.
func (c *Cache) DropUnused(kind string) {
	now := c.epoch.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := c.by[kind]; k != nil {
		for n, e := range k.names {
			if e.used.Load() != now {
				delete(k.names, n)
			}
		}
	}
}

// Sweep is Retain with each entry's value: it keeps the entries of kind
// for which keep is true. keep must not call c.
func Sweep[V any](c *Cache, kind string, keep func(name string, v V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := c.by[kind]; k != nil {
		for n, e := range k.names {
			if v, ok := e.value.(V); !ok || !keep(n, v) {
				delete(k.names, n)
			}
		}
	}
}

// Each calls fn with every entry of kind, in no order. fn must not
// call c.
func Each[V any](c *Cache, kind string, fn func(name string, v V)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if k := c.by[kind]; k != nil {
		for n, e := range k.names {
			if v, ok := e.value.(V); ok {
				fn(n, v)
			}
		}
	}
}

// Named is one entry's name and value.
type Named[V any] struct {
	Name  string
	Value V
}

// Sorted are kind's entries, sorted by name.
func Sorted[V any](c *Cache, kind string) []Named[V] {
	c.mu.RLock()
	var out []Named[V]
	if k := c.by[kind]; k != nil {
		out = make([]Named[V], 0, len(k.names))
		for n, e := range k.names {
			if v, ok := e.value.(V); ok {
				out = append(out, Named[V]{Name: n, Value: v})
			}
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b Named[V]) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Keys lists every entry's key, by kind, then name: the debug view.
func (c *Cache) Keys() []Key {
	c.mu.RLock()
	var out []Key
	for kind, k := range c.by {
		for n, e := range k.names {
			out = append(out, Key{Kind: kind, Name: n, Version: e.version})
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b Key) int { return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name)) })
	return out
}

// KindStats are one kind's entries and how its Gets went.
type KindStats struct {
	Kind    string `json:"kind"`
	Entries int    `json:"entries"`
	Hits    uint64 `json:"hits"`
	Misses  uint64 `json:"misses"`
}

// Stats are every kind's, by kind.
func (c *Cache) Stats() []KindStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]KindStats, 0, len(c.by))
	for kind, k := range c.by {
		out = append(out, KindStats{Kind: kind, Entries: len(k.names), Hits: k.hits.Load(), Misses: k.misses.Load()})
	}
	slices.SortFunc(out, func(a, b KindStats) int { return cmp.Compare(a.Kind, b.Kind) })
	return out
}

// Of is one kind of c's entries, whose values are V: what its users hold
// to get and put entries, a handle that spares each lookup the kind's.
type Of[V any] struct {
	c *Cache
	k *kindEntries
}

// KindOf is c's kind of entries, made if c has none yet.
func KindOf[V any](c *Cache, kind string) Of[V] {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Of[V]{c: c, k: c.kindLocked(kind)}
}

// Get returns the entry of o's kind and name if it was made from
// version, and the cache is on.
func (o Of[V]) Get(name, version string) (V, bool) {
	o.c.mu.RLock()
	e := o.k.names[name]
	o.c.mu.RUnlock()
	var zero V
	if e == nil || !o.c.on || e.version != version {
		o.k.misses.Add(1)
		return zero, false
	}
	v, ok := e.value.(V)
	if !ok {
		o.k.misses.Add(1)
		return zero, false
	}
	o.k.hits.Add(1)
	e.used.Store(o.c.epoch.Load())
	return v, true
}

// Last returns the entry name whatever its version, on or off: what was
// built before, which a change is compared with to declare what it
// changed, and which an entry without a version holds its inputs in.
func (o Of[V]) Last(name string) V {
	o.c.mu.RLock()
	e := o.k.names[name]
	o.c.mu.RUnlock()
	var zero V
	if e == nil {
		return zero
	}
	v, _ := e.value.(V)
	return v
}

// Clear drops the entries named in names.
func (o Of[V]) Clear(names ...string) {
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	for _, n := range names {
		delete(o.k.names, n)
	}
}

// Put makes v the entry name, made from version.
func (o Of[V]) Put(name, version string, v V) {
	e := &entry{version: version, value: v}
	e.used.Store(o.c.epoch.Load())
	o.c.mu.Lock()
	defer o.c.mu.Unlock()
	o.k.names[name] = e
}
