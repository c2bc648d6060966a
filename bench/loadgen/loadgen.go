// Package loadgen drives HTTP and gRPC load for the benchmarks: fixed-rate (open
// loop, latency from each request's scheduled time) and saturation (closed
// loop), with latency quantiles.
package loadgen

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Stats summarise one run.
type Stats struct {
	N, Errors      int
	FirstError     string // the first failure's error, if any
	RPS            float64
	P50, P99, P999 time.Duration
}

func summarize(lat []time.Duration, errors int, first error, elapsed time.Duration) Stats {
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	firstErr := ""
	if first != nil {
		firstErr = first.Error()
	}
	return Stats{FirstError: firstErr, N: len(lat) + errors, Errors: errors, RPS: float64(len(lat)) / elapsed.Seconds(), P50: q(0.5), P99: q(0.99), P999: q(0.999)}
}

// NewClient is an HTTP client keeping up to conns connections.
func NewClient(conns int) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}
}

// Get sends one GET and wants 200.
func Get(c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// FixedRate sends rate GETs of url per second on schedule; each latency
// runs from the request's scheduled time to its response.
func FixedRate(url string, rate int, d time.Duration) Stats {
	client := NewClient(fixedRateWorkers)
	return FixedRateOf(func() error { return Get(client, url) }, rate, d)
}

// ClosedLoop runs conns connections that each send the next GET of url as
// soon as the last one is answered.
func ClosedLoop(url string, conns int, d time.Duration) Stats {
	client := NewClient(conns)
	return ClosedLoopOf(func() error { return Get(client, url) }, conns, d)
}

// fixedRateWorkers bound the calls a fixed-rate run has in flight.
const fixedRateWorkers = 256

// FixedRateOf makes rate calls per second on schedule; each latency runs
// from the call's scheduled time to its end.
func FixedRateOf(call func() error, rate int, d time.Duration) Stats {
	return FixedRateUntil(func() (time.Time, error) {
		err := call()
		return time.Now(), err
	}, rate, d)
}

// FixedRateUntil makes rate calls per second on schedule; each latency runs
// from the call's scheduled time to the moment the call returns (for a
// stream, when its first byte came).
func FixedRateUntil(call func() (time.Time, error), rate int, d time.Duration) Stats {
	total := int(d.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	jobs := make(chan time.Time, total)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, total)
	errors := 0
	var first error
	var wg sync.WaitGroup
	for range fixedRateWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for due := range jobs {
				time.Sleep(time.Until(due))
				at, err := call()
				l := at.Sub(due)
				mu.Lock()
				if err != nil {
					errors++
					first = cmp.Or(first, err)
				} else {
					lat = append(lat, l)
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for i := range total {
		jobs <- start.Add(time.Duration(i) * interval)
	}
	close(jobs)
	wg.Wait()
	return summarize(lat, errors, first, time.Since(start))
}

// ClosedLoopOf runs conns callers that each make the next call as soon as
// the last one ends.
func ClosedLoopOf(call func() error, conns int, d time.Duration) Stats {
	var mu sync.Mutex
	var lat []time.Duration
	errors := 0
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			errs := 0
			var mineFirst error
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := call(); err != nil {
					errs++
					mineFirst = cmp.Or(mineFirst, err)
					continue
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errors += errs
			first = cmp.Or(first, mineFirst)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return summarize(lat, errors, first, time.Since(start))
}

// MS formats d in milliseconds.
func MS(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

// WaitServing waits up to 15 s until url answers 200.
func WaitServing(url string) error {
	deadline := time.Now().Add(15 * time.Second)
	c := NewClient(1)
	for {
		if err := Get(c, url); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s not serving: %w", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Median is the median over runs of a figure of each run's Stats.
func Median(runs []Stats, figure func(Stats) time.Duration) time.Duration {
	ds := make([]time.Duration, 0, len(runs))
	for _, s := range runs {
		ds = append(ds, figure(s))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// Totals are the requests runs sent and those that failed.
func Totals(runs []Stats) (sent, failed int) {
	for _, s := range runs {
		sent, failed = sent+s.N, failed+s.Errors
	}
	return sent, failed
}
