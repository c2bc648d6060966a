//go:build e2e

package e2e

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
)

// load sends GETs through Envoy until stop is closed and counts failures.
type load struct {
	sent, failed atomic.Int64
	// reached counts failures whose request reached a replica that died
	// with it (Envoy: "connection termination", "remote reset").
	reached atomic.Int64
	// first is the first failure.
	first atomic.Value
	stop  chan struct{}
	wg    sync.WaitGroup
	// failures are the first maxFailures failures, with when they
	// happened, for a test to set against its faults.
	mu       sync.Mutex
	failures []event
}

// maxFailures bounds load.failures.
const maxFailures = 50

// minLoad is the least number of requests a load sends before it
// finishes, and minLoadWait how long it has to send them.
const (
	minLoad     = 100
	minLoadWait = 15 * time.Second
)

// event is something that happened during a test, and when.
type event struct {
	at   time.Time
	what string
}

func startLoad(url string, workers int) *load { return startLoadMethod(http.MethodGet, url, workers) }

// startLoadMethod is startLoad with another method (a body with POST).
func startLoadMethod(method, url string, workers int) *load {
	return runLoad(&load{stop: make(chan struct{})}, method, url, workers)
}

func runLoad(l *load, method, url string, workers int) *load {
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			client := &http.Client{Timeout: 5 * time.Second}
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				body := ""
				if method == http.MethodPost {
					body = "payload"
				}
				r := do(client, method, url, body)
				l.sent.Add(1)
				if r.err != nil || r.status != http.StatusOK {
					l.failed.Add(1)
					l.first.CompareAndSwap(nil, r.String())
					l.record(r.String())
					if strings.Contains(r.body, "connection termination") || strings.Contains(r.body, "remote reset") {
						l.reached.Add(1)
					}
				}
			}
		}()
	}
	return l
}

func (l *load) record(result string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) < maxFailures {
		l.failures = append(l.failures, event{at: time.Now(), what: result})
	}
}

// recorded returns the failures recorded so far.
func (l *load) recorded() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event(nil), l.failures...)
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	l.finishAllowingReached(t, false)
}

// finishAllowingReached is finish that, with reached, lets requests fail
// that reached a replica which died with them: a request that is not
// idempotent cannot be sent again. Every other failure fails the test.
func (l *load) finishAllowingReached(t *testing.T, reached bool) {
	t.Helper()
	// A load is a test's evidence that requests kept being served through
	// what it did: it runs for at least minLoad requests, however soon
	// the test's own condition held (an autoscaler that reached its
	// target within a second once stopped a load at 96), and fails below
	// if it could not send them.
	_ = testutil.Until(minLoadWait, func() bool { return l.sent.Load() >= minLoad })
	close(l.stop)
	l.wg.Wait()
	t.Logf("requests through Envoy: %d sent, %d failed (%d had reached a replica that died)", l.sent.Load(), l.failed.Load(), l.reached.Load())
	failed := l.failed.Load()
	if reached {
		failed -= l.reached.Load()
	}
	if failed != 0 {
		for _, e := range l.recorded() {
			t.Logf("failed at %s: %s", e.at.Format("15:04:05.000"), e.what)
		}
		t.Fatalf("%d requests failed, first: %v", l.failed.Load(), l.first.Load())
	}
	if l.sent.Load() < minLoad {
		t.Fatalf("only %d requests were sent (it had %s to send %d); the load did not run", l.sent.Load(), minLoadWait, minLoad)
	}
}
