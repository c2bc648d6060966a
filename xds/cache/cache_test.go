package cache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

func TestGetHitsOnlyTheSameVersion(t *testing.T) {
	c := New(On)
	Put(c, Key{Kind: "backend", Name: "a", Version: "1"}, 10)
	if v, ok := Get[int](c, Key{Kind: "backend", Name: "a", Version: "1"}); !ok || v != 10 {
		t.Fatalf("Get of the version put = %d, %t; want 10, true", v, ok)
	}
	if _, ok := Get[int](c, Key{Kind: "backend", Name: "a", Version: "2"}); ok {
		t.Fatal("Get of another version hit")
	}
	if _, ok := Get[int](c, Key{Kind: "endpoint", Name: "a", Version: "1"}); ok {
		t.Fatal("Get of another kind hit")
	}
	if _, ok := Get[string](c, Key{Kind: "backend", Name: "a", Version: "1"}); ok {
		t.Fatal("Get of another type hit")
	}
}

func TestOffNeverHitsButKeepsTheLast(t *testing.T) {
	c := New(Off)
	k := Key{Kind: "backend", Name: "a", Version: "1"}
	Put(c, k, 10)
	if _, ok := Get[int](c, k); ok {
		t.Fatal("an off cache hit")
	}
	if v, version, ok := Last[int](c, "backend", "a"); !ok || v != 10 || version != "1" {
		t.Fatalf("Last = %d, %q, %t; want what was put: 10, 1, true", v, version, ok)
	}
	if got := c.Stats(); len(got) != 1 || got[0].Hits != 0 || got[0].Misses != 1 || got[0].Entries != 1 {
		t.Fatalf("Stats = %+v; want one entry, one miss", got)
	}
}

func TestClearAndRetainDropWhatTheyName(t *testing.T) {
	c := New(On)
	for _, n := range []string{"a", "b", "c"} {
		Put(c, Key{Kind: "backend", Name: n}, n)
		Put(c, Key{Kind: "endpoint", Name: n}, n)
	}
	c.Clear("backend", "a")
	c.Retain("endpoint", func(n string) bool { return n == "c" })
	if got, want := c.Names("backend"), []string{"b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("backends after Clear(a) = %v; want %v", got, want)
	}
	if got, want := c.Names("endpoint"), []string{"c"}; !slices.Equal(got, want) {
		t.Fatalf("endpoints after Retain(c) = %v; want %v", got, want)
	}
	c.Clear("backend")
	if n := c.Len("backend"); n != 0 {
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
			for i := range 200 {
				k := Key{Kind: fmt.Sprint("k", w%2), Name: fmt.Sprint(i), Version: "v"}
				Put(c, k, i)
				if v, ok := Get[int](c, k); ok && v != i {
					t.Errorf("Get = %d; want %d", v, i)
				}
				_ = c.Keys()
				_ = c.Stats()
			}
		}()
	}
	wg.Wait()
	if c.Len("k0") != 200 || c.Len("k1") != 200 {
		t.Fatalf("entries = %d, %d; want 200 each", c.Len("k0"), c.Len("k1"))
	}
}

func TestDropUnusedKeepsWhatTheRoundUsed(t *testing.T) {
	c := New(On)
	for _, n := range []string{"a", "b", "c"} {
		Put(c, Key{Kind: "kind", Name: n, Version: "1"}, n)
	}
	c.NextEpoch()
	Get[string](c, Key{Kind: "kind", Name: "a", Version: "1"}) // a hit: used
	Get[string](c, Key{Kind: "kind", Name: "b", Version: "2"}) // a miss: not
	Put(c, Key{Kind: "kind", Name: "d", Version: "1"}, "d")    // put: used
	c.DropUnused("kind")
	if got, want := c.Names("kind"), []string{"a", "d"}; !slices.Equal(got, want) {
		t.Fatalf("after a round that used a and d: %v; want %v", got, want)
	}
}
