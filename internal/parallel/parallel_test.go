package parallel

import (
	"errors"
	"sync/atomic"
	"testing"
)

// TestEachCallsEveryIndexOnce: every index is called exactly once, and the
// first error is returned.
func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 2, 100} {
		calls := make([]atomic.Int32, n)
		if err := Each(n, func(i int) error { calls[i].Add(1); return nil }); err != nil {
			t.Fatal(err)
		}
		for i := range calls {
			if got := calls[i].Load(); got != 1 {
				t.Fatalf("n=%d: index %d called %d times", n, i, got)
			}
		}
	}
	boom := errors.New("boom")
	if err := Each(10, func(i int) error {
		if i == 7 {
			return boom
		}
		return nil
	}); !errors.Is(err, boom) {
		t.Fatalf("Each returned %v; want the error of index 7", err)
	}
}
