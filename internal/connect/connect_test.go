package connect

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/url"
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
		// Issue 34: Consul grants every service identity a second name,
		// which servemesh took for a second node.
		"spiffe://11111111.consul/ns/default/dc/dc1/svc/servemesh-node-n7-sidecar-proxy",
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
