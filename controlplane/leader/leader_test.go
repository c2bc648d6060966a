package leader

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/testutil"
)

// TestLeadershipComesBackAfterTheCheckIsLost: when Consul loses the
// controller's check (an agent restarted, a person removed it), the session
// is invalidated and the lock released; the elector registers a new check
// and leads again, with no restart.
func TestLeadershipComesBackAfterTheCheckIsLost(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	var leads, losses atomic.Int64
	e := &Elector{Client: client, Key: "test/leader", Self: Info{ID: "c1", API: "127.0.0.1:1"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), LockDelay: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(context.Context) error { leads.Add(1); return nil },
			func(l Info) {
				if l.ID == "" {
					losses.Add(1)
				}
			})
	}()
	testutil.WaitFor(t, 30*time.Second, "the first leadership", func() bool { return leads.Load() == 1 })
	checks, err := client.Agent().Checks()
	if err != nil {
		t.Fatal(err)
	}
	for id := range checks {
		if strings.HasPrefix(id, "servemesh-controller-c1-") {
			if err := client.Agent().CheckDeregister(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.WaitFor(t, 30*time.Second, "leadership to be lost", func() bool { return losses.Load() >= 1 })
	testutil.WaitFor(t, 30*time.Second, "leadership to come back", func() bool { return leads.Load() >= 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run ended with %v", err)
	}
}

// TestADeadControllerTakesDownNoReplica: a controller that dies without
// cleaning up leaves its check to turn critical; that must take down only
// its own registration, not the replicas registered on the same Consul
// node (a node-level check made every service there critical, so Envoy
// routed to none of them).
func TestADeadControllerTakesDownNoReplica(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	e := &Elector{Client: client, Key: "test/leader", Self: Info{ID: "dead", API: "127.0.0.1:1"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CheckTTL: time.Second}
	if _, err := e.registerCheck(); err != nil { // and no heartbeat: it died
		t.Fatal(err)
	}
	if err := client.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "replica-1", Name: "model", Port: 9000,
		Check: &api.AgentServiceCheck{CheckID: "replica-1", TTL: "1h", Status: api.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		entries, _, err := client.Health().Service("servemesh-controller", "", false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 1 && entries[0].Checks.AggregatedStatus() == api.HealthCritical {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead controller's check never turned critical")
		}
		time.Sleep(100 * time.Millisecond)
	}
	entries, _, err := client.Health().Service("model", "", false, nil)
	if err != nil || len(entries) != 1 {
		t.Fatalf("replica: %d entries, %v", len(entries), err)
	}
	if got := entries[0].Checks.AggregatedStatus(); got != api.HealthPassing {
		t.Fatalf("the replica is %s after a controller on its Consul node died; want passing", got)
	}
}
