package catalog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// countingClient is a Consul client whose connections are counted: open
// now, and the most open at once.
func countingClient(t *testing.T, addr string) (*api.Client, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	var open, peak atomic.Int64
	dialer := &net.Dialer{}
	transport := &http.Transport{MaxIdleConnsPerHost: 64, DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		n := open.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return &countedConn{Conn: c, open: &open}, nil
	}}
	client, err := api.NewClient(&api.Config{Address: addr, HttpClient: &http.Client{Transport: transport}})
	if err != nil {
		t.Fatal(err)
	}
	return client, &open, &peak
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// TestWatcherUsesBoundedConnections watches 250 services (each used to hold
// a blocking query of its own: over 200 connections, HTTP 429 from the
// Consul agent, a lost leadership) and checks that the watcher follows
// their instances' health with a bounded number of connections.
func TestWatcherUsesBoundedConnections(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	admin, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	const services = 250
	var names []string
	for i := range services {
		name := fmt.Sprintf("svc-%03d", i)
		names = append(names, name)
		if err := admin.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: name + "-1", Name: name, Address: "127.0.0.1", Port: 1000 + i,
			Check: &api.AgentServiceCheck{CheckID: name + "-check", TTL: "1h", Status: api.HealthPassing}}); err != nil {
			t.Fatal(err)
		}
	}
	client, open, peak := countingClient(t, consul.HTTPAddr)
	w := NewWatcher(client, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	w.Sync(names)
	testutil.WaitFor(t, 20*time.Second, "every service's instance", func() bool { return len(w.Snapshot()) == services })
	if got := w.TakeChanged(); len(got) != services {
		t.Fatalf("TakeChanged names %d services after every one was first read, want %d", len(got), services)
	}

	// A health change on one service reaches the snapshot.
	if err := admin.Agent().UpdateTTL("svc-123-check", "down", api.HealthCritical); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the critical instance", func() bool { s := w.Snapshot()["svc-123"]; return len(s) == 1 && !s[0].Passing })
	select {
	case <-w.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("Changed was not signalled")
	}
	// The change is carried: the one service that changed is named.
	if got := w.TakeChanged(); !slices.Equal(got, []string{"svc-123"}) {
		t.Fatalf("TakeChanged = %v after one service's health changed, want [svc-123]", got)
	}
	// A new instance too.
	if err := admin.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "svc-007-2", Name: "svc-007", Address: "127.0.0.2", Port: 7,
		Check: &api.AgentServiceCheck{CheckID: "svc-007-2-check", TTL: "1h", Status: api.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the new instance", func() bool { return len(w.Snapshot()["svc-007"]) == 2 })
	if got := w.TakeChanged(); !slices.Equal(got, []string{"svc-007"}) {
		t.Fatalf("TakeChanged = %v after one service's new instance, want [svc-007]", got)
	}
	if got := w.Instances([]string{"svc-007", "unwatched"}); len(got) != 1 || len(got["svc-007"]) != 2 {
		t.Fatalf("Instances of svc-007 and an unwatched service: %v", got)
	}
	t.Logf("connections to Consul: %d open now, at most %d at once, for %d services", open.Load(), peak.Load(), services)
	// One blocking query and Fetchers reads; a read may dial afresh while
	// the connection of the one before it is still being returned to the
	// pool, hence up to Fetchers more for a moment. The old watcher held one
	// connection per service: 250 here.
	if limit := int64(2*w.Fetchers + 1); peak.Load() > limit {
		t.Fatalf("the watcher opened %d connections at once for %d services; want at most %d", peak.Load(), services, limit)
	}
}

// TestExpiredChecks reads, from a real Consul, how each instance's checks
// failed: a TTL check that expired after a ready beat (its agent or Consul
// stalled) is Expired; one its agent reported failing, one that expired
// after a failing beat, and one that never beat are not.
func TestExpiredChecks(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	register := func(id, ttl string) {
		t.Helper()
		if err := client.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: "svc", Address: "127.0.0.1", Port: 9000 + len(id),
			Check: &api.AgentServiceCheck{CheckID: id, TTL: ttl, Status: api.HealthCritical}}); err != nil {
			t.Fatal(err)
		}
	}
	beat := func(id, status, output string) {
		t.Helper()
		if err := client.Agent().UpdateTTL(id, output, status); err != nil {
			t.Fatal(err)
		}
	}
	register("ready", "1h")
	beat("ready", api.HealthPassing, wire.ReplicaReadyOutput)
	register("stalled", "500ms")
	beat("stalled", api.HealthPassing, wire.ReplicaReadyOutput)
	register("failing", "1h")
	beat("failing", api.HealthCritical, "/health answered 500")
	register("stalled-failing", "500ms")
	beat("stalled-failing", api.HealthCritical, "/health answered 500")
	register("never-beat", "500ms")

	w := NewWatcher(client, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	w.Sync([]string{"svc"})
	want := map[string][2]bool{ // passing, expired
		"ready": {true, false}, "stalled": {false, true}, "failing": {false, false},
		"stalled-failing": {false, false}, "never-beat": {false, false},
	}
	testutil.WaitFor(t, 20*time.Second, "the stalled check to expire", func() bool {
		for _, in := range w.Snapshot()["svc"] {
			if in.ID == "stalled" && in.Expired {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second) // every 500 ms TTL has run out
	got := map[string][2]bool{}
	for _, in := range w.Snapshot()["svc"] {
		got[in.ID] = [2]bool{in.Passing, in.Expired}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("(passing, expired) by instance:\n got  %v\n want %v", got, want)
	}
}
