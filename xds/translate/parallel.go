package translate

import (
	"runtime"

	"golang.org/x/sync/errgroup"
)

// eachInParallel calls fn(i) for i in [0, n) on up to GOMAXPROCS
// goroutines and returns the first error. The parts a Build or ForNodes
// rebuilds are independent of one another (a backend's on the backend
// alone, a node's own on the node and the backends' parts, which are
// only read), so a full publish of a large mesh uses every core; fn
// writes its result to its own slot and shares nothing else.
func eachInParallel(n int, fn func(i int) error) error {
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
