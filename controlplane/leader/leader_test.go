package leader

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the first leadership", func() bool { return leads.Load() == 1 })
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
	waitFor("leadership to be lost", func() bool { return losses.Load() >= 1 })
	waitFor("leadership to come back", func() bool { return leads.Load() >= 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run ended with %v", err)
	}
}
