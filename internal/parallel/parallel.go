// Package parallel runs independent pieces of one computation on every
// core: the xDS translation's rebuilt backends and nodes, and the xDS
// server's nodes' snapshots. It owns nothing else.
package parallel

import (
	"runtime"

	"golang.org/x/sync/errgroup"
)

// Each calls fn(i) for i in [0, n) on up to GOMAXPROCS goroutines and
// returns the first error. The pieces must be independent: fn writes its
// result to its own slot and shares nothing else, or guards what it
// shares.
func Each(n int, fn func(i int) error) error {
	if n < 2 {
		for i := range n {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range n {
		g.Go(func() error { return fn(i) })
	}
	return g.Wait()
}
