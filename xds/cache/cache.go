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
	names        map[string]entry
	hits, misses atomic.Uint64
}

type entry struct {
	version string
	value   any
	used    *atomic.Uint64 // the epoch it was last got or put in
}

// New returns an empty cache.
func New(mode Mode) *Cache {
	return &Cache{on: bool(mode), by: map[string]*kindEntries{}}
}

// kind is kind's entries, made if c has none yet.
func (c *Cache) kind(kind string) *kindEntries {
	c.mu.RLock()
	k := c.by[kind]
	c.mu.RUnlock()
	if k != nil {
		return k
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if k = c.by[kind]; k == nil {
		k = &kindEntries{names: map[string]entry{}}
		c.by[kind] = k
	}
	return k
}

// On reports whether c reuses what it holds.
func (c *Cache) On() bool { return c.on }

// Get returns the entry of k's kind and name if it was made from k's
// version, and the cache is on.
func Get[V any](c *Cache, k Key) (V, bool) {
	v, version, ok := lookup[V](c, k.Kind, k.Name)
	hit := ok && c.on && version == k.Version
	if counts := c.kind(k.Kind); hit {
		counts.hits.Add(1)
		c.touch(k.Kind, k.Name)
	} else {
		counts.misses.Add(1)
	}
	if !hit {
		var zero V
		return zero, false
	}
	return v, true
}

// Last returns the entry of kind and name whatever its version, and that
// version, on or off: what was built before, which a change is compared
// with to declare what it changed, and which an entry without a version
// holds its inputs in.
func Last[V any](c *Cache, kind, name string) (V, string, bool) {
	return lookup[V](c, kind, name)
}

// touch records that kind's entry name was used in this epoch.
func (c *Cache) touch(kind, name string) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, ok := c.by[kind].names[name]; ok {
		e.used.Store(c.epoch.Load())
	}
}

func lookup[V any](c *Cache, kind, name string) (V, string, bool) {
	c.mu.RLock()
	var e entry
	var ok bool
	if k := c.by[kind]; k != nil {
		e, ok = k.names[name]
	}
	c.mu.RUnlock()
	v, typed := e.value.(V)
	return v, e.version, ok && typed
}

// Put makes v the entry of k's kind and name, made from k's version.
func Put[V any](c *Cache, k Key, v V) {
	kind := c.kind(k.Kind)
	c.mu.Lock()
	defer c.mu.Unlock()
	used := &atomic.Uint64{}
	used.Store(c.epoch.Load())
	kind.names[k.Name] = entry{version: k.Version, value: v, used: used}
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

// Len is how many entries of kind c holds.
func (c *Cache) Len(kind string) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if k := c.by[kind]; k != nil {
		return len(k.names)
	}
	return 0
}

// Names are the names of kind's entries, sorted.
func (c *Cache) Names(kind string) []string {
	c.mu.RLock()
	var out []string
	if k := c.by[kind]; k != nil {
		out = make([]string, 0, len(k.names))
		for n := range k.names {
			out = append(out, n)
		}
	}
	c.mu.RUnlock()
	slices.Sort(out)
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
