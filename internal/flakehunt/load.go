package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// loadPeriod is the mean length of one spin and its sleep: short enough
// that the tests' threads are preempted at many points of their work.
const loadPeriod = 4 * time.Millisecond

// startLoad starts n goroutines, each locked to its own OS thread, that
// spin for a random burst around duty of loadPeriod and sleep for a
// random while around the rest, until ctx ends; the returned channel
// closes once all have stopped.
func startLoad(ctx context.Context, n int, duty float64) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			spin, rest := time.Duration(duty*float64(loadPeriod)), time.Duration((1-duty)*float64(loadPeriod))
			for ctx.Err() == nil {
				burn(jitter(spin))
				if r := jitter(rest); r > 0 {
					time.Sleep(r)
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// jitter is a random duration between 0 and twice d.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(2 * d)
}

// burn spins the CPU for d.
func burn(d time.Duration) {
	x := uint64(1)
	for end := time.Now().Add(d); time.Now().Before(end); {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink.Store(x)
}

// sink keeps burn's work from being optimised away.
var sink atomic.Uint64
