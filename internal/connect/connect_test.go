package connect

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"
)

func TestIdentityPrefixAndNode(t *testing.T) {
	u, _ := url.Parse("spiffe://11111111.consul/ns/default/dc/dc1/svc/servemesh-node-n7")
	cert := &x509.Certificate{URIs: []*url.URL{u}}
	if p, ok := IdentityPrefix(cert); !ok || p != "spiffe://11111111.consul/ns/default/dc/dc1/svc/" {
		t.Fatalf("prefix %q, %v", p, ok)
	}
	prefix := "spiffe://11111111.consul/ns/default/dc/dc1/svc/"
	if n, ok := NodeOf(cert, prefix); !ok || n != "n7" {
		t.Fatalf("node %q, %v", n, ok)
	}
	// Only the mesh's own trust domain and datacenter name a node, and only
	// a node's whole service name (it was a match on the service name alone).
	for _, other := range []string{
		"spiffe://22222222.consul/ns/default/dc/dc1/svc/servemesh-node-n7",
		"spiffe://11111111.consul/ns/default/dc/dc2/svc/servemesh-node-n7",
		"spiffe://11111111.consul/ns/other/dc/dc1/svc/servemesh-node-n7",
		"spiffe://11111111.consul/ns/default/dc/dc1/svc/servemesh-node-",
		"spiffe://11111111.consul/ns/default/dc/dc1/svc/servemesh-node-n7/x",
		"spiffe://11111111.consul/ns/default/dc/dc1/svc/model-servemesh-node-n7",
	} {
		u, _ := url.Parse(other)
		if n, ok := NodeOf(&x509.Certificate{URIs: []*url.URL{u}}, prefix); ok {
			t.Errorf("%s names node %q of the mesh %s", other, n, prefix)
		}
	}
	if _, ok := IdentityPrefix(&x509.Certificate{}); ok {
		t.Fatal("a certificate without a SPIFFE id has a prefix")
	}
}

// TestWatchFollowsIndexesAndRetries: each query gets the last answer's
// index; a failed query is retried (with the same index), and an index
// that goes back starts over.
func TestWatchFollowsIndexesAndRetries(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []uint64
	answers := []struct {
		next uint64
		err  error
	}{{5, nil}, {0, errors.New("consul away")}, {9, nil}, {3, nil}, {4, nil}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, slog.New(slog.DiscardHandler), "test", func(_ context.Context, index uint64) (uint64, error) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, index)
			if len(got) > len(answers) {
				cancel()
				return index, nil
			}
			a := answers[len(got)-1]
			return a.next, a.err
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after its context ended")
	}
	want := []uint64{0, 5, 5, 9, 0, 4}
	if len(got) != len(want) {
		t.Fatalf("indexes %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("indexes %v, want %v", got, want)
		}
	}
}

// TestRetry: a failing fetch is tried again until it succeeds, and given
// up with its error when the context ends.
func TestRetry(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	calls := 0
	err := Retry(context.Background(), log, "test", func(context.Context) error {
		calls++
		if calls < 2 {
			return errors.New("consul not up yet")
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("Retry: %v after %d calls, want success on the second", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = Retry(ctx, log, "test", func(context.Context) error { return errors.New("connect is off") })
	if err == nil || err.Error() != "connect is off" {
		t.Fatalf("Retry after its context ended: %v, want the last error", err)
	}
}
