package cache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// names are the names of kind's entries in c, sorted, as the debug view
// lists them.
func names(c *Cache, kind string) []string {
	var out []string
	for _, k := range c.Keys() {
		if k.Kind == kind {
			out = append(out, k.Name)
		}
	}
	return out
}

func TestGetHitsOnlyTheSameVersion(t *testing.T) {
	c := New(On)
	backends := KindOf[int](c, "backend")
	backends.Put("a", "1", 10)
	if v, ok := backends.Get("a", "1"); !ok || v != 10 {
		t.Fatalf("Get of the version put = %d, %t; want 10, true", v, ok)
	}
	if _, ok := backends.Get("a", "2"); ok {
		t.Fatal("Get of another version hit")
	}
	if _, ok := KindOf[int](c, "endpoint").Get("a", "1"); ok {
		t.Fatal("Get of another kind hit")
	}
	if _, ok := KindOf[string](c, "backend").Get("a", "1"); ok {
		t.Fatal("Get of another type hit")
	}
}

func TestOffNeverHitsButKeepsTheLast(t *testing.T) {
	c := New(Off)
	backends := KindOf[int](c, "backend")
	backends.Put("a", "1", 10)
	if _, ok := backends.Get("a", "1"); ok {
		t.Fatal("an off cache hit")
	}
	if v, keys := backends.Last("a"), c.Keys(); v != 10 || !slices.Equal(keys, []Key{{Kind: "backend", Name: "a", Version: "1"}}) {
		t.Fatalf("Last = %d, keys %v; want what was put: 10, version 1", v, keys)
	}
	if got := c.Stats(); len(got) != 1 || got[0].Hits != 0 || got[0].Misses != 1 || got[0].Entries != 1 {
		t.Fatalf("Stats = %+v; want one entry, one miss", got)
	}
}

func TestClearAndRetainDropWhatTheyName(t *testing.T) {
	c := New(On)
	backends, endpoints := KindOf[string](c, "backend"), KindOf[string](c, "endpoint")
	for _, n := range []string{"a", "b", "c"} {
		backends.Put(n, "", n)
		endpoints.Put(n, "", n)
	}
	backends.Clear("a")
	c.Retain("endpoint", func(n string) bool { return n == "c" })
	if got, want := names(c, "backend"), []string{"b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("backends after Clear(a) = %v; want %v", got, want)
	}
	if got, want := names(c, "endpoint"), []string{"c"}; !slices.Equal(got, want) {
		t.Fatalf("endpoints after Retain(c) = %v; want %v", got, want)
	}
	c.Clear("backend")
	if n := len(names(c, "backend")); n != 0 {
		t.Fatalf("Clear(kind) left %d entries", n)
	}
	want := []Key{{Kind: "endpoint", Name: "c"}}
	if got := c.Keys(); !slices.Equal(got, want) {
		t.Fatalf("Keys = %v; want %v", got, want)
	}
}

// TestConcurrentReadersAndWriters: the builder reads and writes from
// parallel goroutines, the debug view lists from the API's (-race).
func TestConcurrentReadersAndWriters(t *testing.T) {
	c := New(On)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kind := KindOf[int](c, fmt.Sprint("k", w%2))
			for i := range 200 {
				kind.Put(fmt.Sprint(i), "v", i)
				if v, ok := kind.Get(fmt.Sprint(i), "v"); ok && v != i {
					t.Errorf("Get = %d; want %d", v, i)
				}
				_ = c.Keys()
				_ = c.Stats()
			}
		}()
	}
	wg.Wait()
	if n0, n1 := len(names(c, "k0")), len(names(c, "k1")); n0 != 200 || n1 != 200 {
		t.Fatalf("entries = %d, %d; want 200 each", n0, n1)
	}
}

func TestDropUnusedKeepsWhatTheRoundUsed(t *testing.T) {
	c := New(On)
	kinds := KindOf[string](c, "kind")
	for _, n := range []string{"a", "b", "c"} {
		kinds.Put(n, "1", n)
	}
	c.NextEpoch()
	kinds.Get("a", "1")      // a hit: used
	kinds.Get("b", "2")      // a miss: not
	kinds.Put("d", "1", "d") // put: used
	c.DropUnused("kind")
	if got, want := names(c, "kind"), []string{"a", "d"}; !slices.Equal(got, want) {
		t.Fatalf("after a round that used a and d: %v; want %v", got, want)
	}
}
