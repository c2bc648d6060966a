package demoreplica

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/meshspec"
)

func TestFleetServesEveryStaticReplicaOnce(t *testing.T) {
	ctx := context.Background()
	f := NewFleet(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer f.Stop()
	a, _ := proc.FreeAddr(ctx, "127.0.0.1")
	b, _ := proc.FreeAddr(ctx, "127.0.0.1")
	m := &meshspec.Model{Backends: []meshspec.Backend{
		{Name: "v1", Replicas: []meshspec.Replica{{Address: a}}},
		{Name: "v2", Replicas: []meshspec.Replica{{Address: b}}},
	}}
	if err := f.Ensure(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := f.Ensure(ctx, m); err != nil { // already running: nothing to start
		t.Fatalf("a second Ensure must not start the replicas again: %v", err)
	}
	for range 3 {
		resp, err := http.Get("http://" + a + "/") //nolint:noctx // test
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.Header.Get(BackendHeader) != "v1" {
			t.Fatalf("answered by %q, want v1", resp.Header.Get(BackendHeader))
		}
	}
	if got := f.Counts(); got != "v1=3 v2=0" {
		t.Fatalf("counts %q", got)
	}
}
