package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/testutil"
)

var consul *testutil.Consul

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "servemesh-store-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	consul, err = testutil.StartConsul(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "store tests need the real Consul: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	consul.Stop()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// stores returns each implementation, the Consul one under a fresh prefix.
func stores(t *testing.T) map[string]Store {
	t.Helper()
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]Store{
		"memory": NewMemory(),
		"consul": NewConsul(client, "test/"+strings.ReplaceAll(t.Name(), "/", "-")),
	}
}

func sample(n int) *model.Model {
	m := &model.Model{}
	for i := range n {
		m.Backends = append(m.Backends, model.Backend{Name: fmt.Sprintf("b%d", i), Replicas: []model.Replica{{Address: fmt.Sprintf("127.0.0.1:%d", 9000+i)}}})
		m.Endpoints = append(m.Endpoints, model.Endpoint{Name: fmt.Sprintf("e%d", i), Route: fmt.Sprintf("/e%d", i), Traffic: map[string]float64{fmt.Sprintf("b%d", i): 1}})
	}
	return m
}

func TestStoreContract(t *testing.T) {
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			m, rev, err := st.Load(ctx)
			if err != nil || rev != 0 || len(m.Backends)+len(m.Endpoints) != 0 {
				t.Fatalf("fresh store: %+v rev %d err %v", m, rev, err)
			}
			want := sample(3)
			rev1, err := st.Commit(ctx, 0, Diff(&model.Model{}, want))
			if err != nil || rev1 == 0 {
				t.Fatalf("first commit: rev %d err %v", rev1, err)
			}
			if _, err := st.Commit(ctx, 0, Change{DeleteEndpoints: []string{"e0"}}); !errors.Is(err, ErrConflict) {
				t.Fatalf("commit at a stale revision: %v, want ErrConflict", err)
			}
			got, rev, err := st.Load(ctx)
			if err != nil || rev != rev1 || Diff(got, want).Size() != 0 {
				t.Fatalf("load after commit: rev %d (want %d), err %v, diff %+v", rev, rev1, err, Diff(got, want))
			}

			// Watch wakes on the next commit with the new state.
			type watched struct {
				m   *model.Model
				rev Revision
				err error
			}
			woke := make(chan watched, 1)
			go func() {
				m, r, err := st.Watch(ctx, rev1)
				woke <- watched{m, r, err}
			}()
			select {
			case w := <-woke:
				t.Fatalf("watch returned before any change: %+v", w)
			case <-time.After(200 * time.Millisecond):
			}
			rev2, err := st.Commit(ctx, rev1, Change{DeleteEndpoints: []string{"e0"}, DeleteBackends: []string{"b0"}})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case w := <-woke:
				if w.err != nil || w.rev != rev2 || len(w.m.Backends) != 2 || len(w.m.Endpoints) != 2 {
					t.Fatalf("watch: rev %d (want %d), %d backends, err %v", w.rev, rev2, len(w.m.Backends), w.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("watch did not wake on a commit")
			}

			// Watch ends with its context.
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if _, _, err := st.Watch(cctx, rev2); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("watch after its context ended: %v", err)
			}

			if _, err := st.Commit(ctx, rev2, Diff(&model.Model{}, sample(40))); err == nil || !strings.Contains(err.Error(), "split it") {
				t.Fatalf("an oversized change: %v", err)
			}
		})
	}
}

func TestConsulRefusesAnotherSchema(t *testing.T) {
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	st := NewConsul(client, "test/schema")
	if _, err := st.Commit(context.Background(), 0, Diff(&model.Model{}, sample(1))); err != nil {
		t.Fatal(err)
	}
	if _, err := client.KV().Put(&api.KVPair{Key: "test/schema/backends/b0", Value: []byte(`{"schema": 2, "backend": {}}`)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "schema 2") {
		t.Fatalf("load of a newer schema: %v", err)
	}
}

func TestSplitKeepsEveryCommitSmallAndOrdered(t *testing.T) {
	parts := Split(Diff(sample(100), sample(0)))
	if len(parts) != 4 {
		t.Fatalf("200 deletions in %d parts, want 4", len(parts))
	}
	if len(parts[0].DeleteEndpoints) != MaxChangeObjects || len(parts[0].DeleteBackends) != 0 {
		t.Fatalf("endpoints must be deleted before backends: first part %+v", parts[0])
	}
	m := sample(100)
	for i, p := range parts {
		if p.Size() > MaxChangeObjects {
			t.Fatalf("part %d has %d objects", i, p.Size())
		}
		m = Apply(m, p)
		if err := m.Validate(); err != nil {
			t.Fatalf("state after part %d is invalid: %v", i, err)
		}
	}
}
