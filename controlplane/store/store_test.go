package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
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
		"consul": NewConsul(client, freshPrefix(t), slog.New(slog.DiscardHandler)),
	}
}

func sample(n int) *meshspec.Model {
	m := &meshspec.Model{}
	for i := range n {
		m.Backends = append(m.Backends, meshspec.Backend{Name: fmt.Sprintf("b%d", i), Replicas: []meshspec.Replica{{Address: fmt.Sprintf("127.0.0.1:%d", 9000+i)}}})
		m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: fmt.Sprintf("e%d", i), Route: fmt.Sprintf("/e%d", i), Traffic: map[string]float64{fmt.Sprintf("b%d", i): 1}})
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
			rev1, err := st.Commit(ctx, 0, Diff(&meshspec.Model{}, want))
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

			// Wait wakes on the next commit with its revision.
			type watched struct {
				rev Revision
				err error
			}
			woke := make(chan watched, 1)
			go func() {
				r, err := st.Wait(ctx, rev1)
				woke <- watched{r, err}
			}()
			select {
			case w := <-woke:
				t.Fatalf("wait returned before any change: %+v", w)
			case <-time.After(200 * time.Millisecond):
			}
			rev2, err := st.Commit(ctx, rev1, Change{DeleteEndpoints: []string{"e0"}, DeleteBackends: []string{"b0"}})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case w := <-woke:
				if w.err != nil || w.rev != rev2 {
					t.Fatalf("wait: rev %d (want %d), err %v", w.rev, rev2, w.err)
				}
				if m, rev, err := st.Load(ctx); err != nil || rev != rev2 || len(m.Backends) != 2 || len(m.Endpoints) != 2 {
					t.Fatalf("load after the wait: rev %d (want %d), %d backends, err %v", rev, rev2, len(m.Backends), err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("wait did not wake on a commit")
			}

			// Wait ends with its context.
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if _, err := st.Wait(cctx, rev2); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("watch after its context ended: %v", err)
			}

			// A change of any size is one atomic commit: 400 objects, far
			// more than one Consul transaction holds.
			big := sample(200)
			cur, _, err := st.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rev3, err := st.Commit(ctx, rev2, Diff(cur, big))
			if err != nil {
				t.Fatalf("a large change: %v", err)
			}
			if got, rev, err := st.Load(ctx); err != nil || rev != rev3 || Diff(got, big).Size() != 0 {
				t.Fatalf("load after a large change: rev %d (want %d), err %v, %d differences", rev, rev3, err, Diff(got, big).Size())
			}

			// The mesh's settings are one key, written and cleared.
			sampling := 5.0
			traced := meshspec.Clone(big)
			traced.Mesh = &meshspec.Mesh{Tracing: &meshspec.Tracing{Collector: "127.0.0.1:4317", SamplingPercent: &sampling}}
			rev4, err := st.Commit(ctx, rev3, Diff(big, traced))
			if err != nil {
				t.Fatalf("set the mesh's tracing: %v", err)
			}
			if got, _, err := st.Load(ctx); err != nil || got.Mesh == nil || got.Mesh.Tracing == nil || got.Mesh.Tracing.Sampling() != 5 {
				t.Fatalf("load after setting the mesh's tracing: %+v, %v", got.Mesh, err)
			}
			if _, err := st.Commit(ctx, rev4, Diff(traced, big)); err != nil {
				t.Fatalf("clear the mesh's tracing: %v", err)
			}
			if got, _, err := st.Load(ctx); err != nil || got.Mesh != nil {
				t.Fatalf("load after clearing the mesh's settings: %+v, %v", got.Mesh, err)
			}
			if u := st.Unreadable(); len(u) != 0 {
				t.Fatalf("a store servemesh wrote has unreadable keys: %+v", u)
			}
		})
	}
}

// consulStore returns a Consul store under a fresh prefix and the raw KV.
func consulStore(t *testing.T) (*Consul, *api.KV, string) {
	t.Helper()
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	prefix := freshPrefix(t)
	return NewConsul(client, prefix, slog.New(slog.DiscardHandler)), client.KV(), prefix
}

// prefixes numbers the tests' prefixes in the package's one Consul.
var prefixes atomic.Int64

// freshPrefix is a KV prefix no other test, and no other run of this test
// (go test -count), has used.
func freshPrefix(t *testing.T) string {
	return fmt.Sprintf("test/%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), prefixes.Add(1))
}

func put(t *testing.T, kv *api.KV, key, value string) {
	t.Helper()
	if _, err := kv.Put(&api.KVPair{Key: key, Value: []byte(value)}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestOldSizingOfListedReplicasIsDropped: num_replicas, cpus and memory_mb
// stored on a backend of listed replicas (older versions accepted them; they
// never had an effect) are read as unset, not as an unreadable backend.
func TestOldSizingOfListedReplicasIsDropped(t *testing.T) {
	st, kv, prefix := consulStore(t)
	ctx := context.Background()
	if _, err := st.Commit(ctx, 0, Diff(&meshspec.Model{}, sample(1))); err != nil {
		t.Fatal(err)
	}
	put(t, kv, prefix+"/backends/legacy", `{"schema": 1, "backend": {"name": "legacy", "config": {"num_replicas": 5, "cpus": 3, "memory_mb": 64}, "replicas": [{"address": "10.0.0.1:80"}]}}`)
	m, _, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range m.Backends {
		if b.Name == "legacy" {
			if b.Config.NumReplicas != 0 || b.Config.CPUs != 0 || b.Config.MemoryMB != 0 || len(b.Replicas) != 1 {
				t.Fatalf("legacy read as %+v, want its replica and no sizing", b)
			}
			return
		}
	}
	t.Fatalf("legacy was left out: %v", st.Unreadable())
}

// TestStrayKeysAreReportedNotFatal: keys a person or another tool put under
// the prefix (the Consul UI's "create folder" makes an empty "backends/")
// never stop a reader; they are left out, reported, and left untouched by
// later commits.
func TestStrayKeysAreReportedNotFatal(t *testing.T) {
	st, kv, prefix := consulStore(t)
	ctx := context.Background()
	rev, err := st.Commit(ctx, 0, Diff(&meshspec.Model{}, sample(2)))
	if err != nil {
		t.Fatal(err)
	}
	stray := map[string]string{
		prefix + "/backends/":          "",
		prefix + "/something-else":     "hello",
		prefix + "/backends/broken":    "{not json",
		prefix + "/backends/newer":     `{"schema": 2, "backend": {"name": "newer"}}`,
		prefix + "/backends/alias":     `{"schema": 1, "backend": {"name": "b0"}}`,
		prefix + "/backends/bad-value": `{"schema": 1, "backend": {"name": "bad-value", "config": {"max_concurrent_queries": -5}}}`,
		prefix + "/endpoints/orphan":   `{"schema": 1, "endpoint": {"name": "orphan", "route": "/o", "traffic": {"broken": 1}}}`,
	}
	for k, v := range stray {
		put(t, kv, k, v)
	}
	m, rev2, err := st.Load(ctx)
	if err != nil {
		t.Fatalf("stray keys stopped the load: %v", err)
	}
	if rev2 != rev || Diff(m, sample(2)).Size() != 0 {
		t.Fatalf("the readable state changed: rev %d (want %d), %d differences", rev2, rev, Diff(m, sample(2)).Size())
	}
	unreadable := map[string]string{}
	for _, u := range st.Unreadable() {
		unreadable[u.Key] = u.Reason
		if want := map[bool]string{true: "broken"}[u.Key == prefix+"/endpoints/orphan"]; u.Backend != want {
			t.Errorf("%s: left out for backend %q, want %q", u.Key, u.Backend, want)
		}
	}
	for k := range stray {
		if unreadable[k] == "" {
			t.Errorf("stray key %s is not reported", k)
		}
	}
	if !strings.Contains(unreadable[prefix+"/backends/newer"], "schema 2") || !strings.Contains(unreadable[prefix+"/endpoints/orphan"], `backend "broken"`) {
		t.Errorf("reasons: %+v", unreadable)
	}
	// Writes go on, and leave the stray keys as they were.
	rev3, err := st.Commit(ctx, rev, Diff(m, sample(300)))
	if err != nil {
		t.Fatalf("a commit over stray keys: %v", err)
	}
	for k, v := range stray {
		pair, _, err := kv.Get(k, nil)
		if err != nil || pair == nil || string(pair.Value) != v {
			t.Errorf("stray key %s was changed or removed", k)
		}
	}
	// A key a commit writes is no longer reported, though the writer does
	// not read its commit back; the others still are.
	fixed := meshspec.Backend{Name: "broken", Replicas: []meshspec.Replica{{Address: "10.0.0.9:9000"}}}
	if _, err := st.Commit(ctx, rev3, Change{PutBackends: []meshspec.Backend{fixed}}); err != nil {
		t.Fatal(err)
	}
	still := map[string]bool{}
	for _, u := range st.Unreadable() {
		still[u.Key] = true
	}
	if still[prefix+"/backends/broken"] || len(still) != len(stray)-1 {
		t.Errorf("after overwriting %s/backends/broken, unreadable: %v (want the %d others)", prefix, still, len(stray)-1)
	}
}

// TestInterruptedLargeCommit: a large change is visible exactly when its
// meta check-and-set lands. One recorded but never committed is invisible
// and Settle removes it; one committed but not applied is read whole, and
// Settle finishes applying it.
func TestInterruptedLargeCommit(t *testing.T) {
	st, kv, prefix := consulStore(t)
	ctx := context.Background()
	rev, err := st.Commit(ctx, 0, Diff(&meshspec.Model{}, sample(10)))
	if err != nil {
		t.Fatal(err)
	}
	change := Diff(sample(10), sample(150))

	// Recorded, never committed: the old state, and Settle cleans up.
	id, _, err := st.writeRecord(ctx, change)
	if err != nil {
		t.Fatal(err)
	}
	if m, r, _ := st.Load(ctx); r != rev || Diff(m, sample(10)).Size() != 0 {
		t.Fatal("an uncommitted record changed the state")
	}
	if err := st.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, _, _ := kv.Keys(st.pendingDir(id), "", nil); len(keys) != 0 {
		t.Fatalf("Settle left an uncommitted record: %v", keys)
	}

	// Committed, then the writer died before applying: the new state whole.
	id, parts, err := st.writeRecord(ctx, change)
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := encodeMeta(&pendingRef{ID: id, Parts: parts})
	committed, err := st.casMeta(ctx, uint64(rev), meta)
	if err != nil {
		t.Fatal(err)
	}
	if m, r, _ := st.Load(ctx); r != committed || Diff(m, sample(150)).Size() != 0 {
		t.Fatalf("a committed, unapplied change is not read whole: rev %d, %d differences", r, Diff(m, sample(150)).Size())
	}
	if err := st.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	m, r, _ := st.Load(ctx)
	if r <= committed || Diff(m, sample(150)).Size() != 0 {
		t.Fatalf("after Settle: rev %d, %d differences", r, Diff(m, sample(150)).Size())
	}
	if keys, _, _ := kv.Keys(prefix+"/pending/", "", nil); len(keys) != 0 {
		t.Fatalf("Settle left the record: %v", keys)
	}
	if keys, _, _ := kv.Keys(prefix+"/endpoints/", "", nil); len(keys) != 150 {
		t.Fatalf("Settle applied %d endpoints of 150", len(keys))
	}
}

func TestOversizedObjectIsRefused(t *testing.T) {
	st, _, _ := consulStore(t)
	b := meshspec.Backend{Name: "fat", Process: &meshspec.ProcessSpec{Command: "/srv/x", Args: []string{strings.Repeat("a", MaxValueBytes)}}}
	_, err := st.Commit(context.Background(), 0, Change{PutBackends: []meshspec.Backend{b}})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("got %v, want ErrTooLarge naming the limit", err)
	}
}

// TestWriterIsRecordedAndANewerOneRefused: every commit names its writer's
// release and protocol in the meta key; state that a release announcing
// none wrote (protocol 1) is read and rewritten; state that a newer
// protocol wrote is read, but a commit over it is refused with the fix,
// changing nothing.
func TestWriterIsRecordedAndANewerOneRefused(t *testing.T) {
	st, kv, prefix := consulStore(t)
	ctx := context.Background()
	put(t, kv, prefix+"/meta", `{"schema": 1, "updated_at": "2026-11-01T00:00:00Z"}`) // as a release before versions wrote it
	_, rev, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = st.Commit(ctx, rev, Diff(&meshspec.Model{}, sample(1))); err != nil {
		t.Fatalf("commit over state of a release that announced no protocol: %v", err)
	}
	pair, _, err := kv.Get(prefix+"/meta", nil)
	if err != nil {
		t.Fatal(err)
	}
	var meta metaValue
	if err := json.Unmarshal(pair.Value, &meta); err != nil || meta.WrittenBy == nil || meta.WrittenBy.Protocol != wire.Protocol {
		t.Fatalf("meta %s: want written_by with protocol %d", pair.Value, wire.Protocol)
	}
	newer := fmt.Sprintf(`{"schema": 1, "updated_at": "2027-01-01T00:00:00Z", "written_by": {"version": "v9", "protocol": %d}}`, wire.Protocol+1)
	put(t, kv, prefix+"/meta", newer)
	m, rev, err := st.Load(ctx)
	if err != nil || len(m.Backends) != 1 {
		t.Fatalf("state a newer release wrote: %v, %+v; want it read", err, m)
	}
	_, err = st.Commit(ctx, rev, Diff(m, sample(2)))
	if !errors.Is(err, ErrNewerWriter) || !strings.Contains(err.Error(), fmt.Sprintf("run a controller of protocol %d or later", wire.Protocol+1)) {
		t.Fatalf("commit over a newer writer's state: %v", err)
	}
	if pair, _, _ := kv.Get(prefix+"/meta", nil); string(pair.Value) != newer {
		t.Fatalf("the refused commit changed the meta key: %s", pair.Value)
	}
}

// A retiring backend (deleted, its replicas finishing their requests) is
// stored under its backend key, marked: moving there from the backends is
// a write, never a delete, and it is deleted when it leaves both.
func TestRetiringBackendsKeepTheirKey(t *testing.T) {
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			live := meshspec.Backend{Name: "p", Process: &meshspec.ProcessSpec{Command: "/bin/replica"}, Config: meshspec.BackendConfig{NumReplicas: 1},
				Placements: []meshspec.Placement{{Tag: "p#00000a", Node: "n1", State: meshspec.Running}}}
			one := &meshspec.Model{Backends: []meshspec.Backend{live}}
			rev, err := st.Commit(ctx, 0, Diff(&meshspec.Model{}, one))
			if err != nil {
				t.Fatal(err)
			}
			retired := live
			retired.Config.NumReplicas = 0
			retired.Placements = []meshspec.Placement{{Tag: "p#00000a", Node: "n1", State: meshspec.Draining, Since: 1}}
			two := &meshspec.Model{Retiring: []meshspec.Backend{retired}}
			change := Diff(one, two)
			if len(change.PutRetiring) != 1 || len(change.DeleteBackends) != 0 || len(change.PutBackends) != 0 {
				t.Fatalf("retiring p: %+v; want it written as retiring, not deleted", change)
			}
			if rev, err = st.Commit(ctx, rev, change); err != nil {
				t.Fatal(err)
			}
			got, _, err := st.Load(ctx)
			if err != nil || len(got.Backends) != 0 || Diff(got, two).Size() != 0 {
				t.Fatalf("loaded %+v (err %v, unreadable %v); want p retiring alone", got, err, st.Unreadable())
			}
			change = Diff(two, &meshspec.Model{})
			if len(change.DeleteBackends) != 1 {
				t.Fatalf("p's last replica gone: %+v; want its key deleted", change)
			}
			if _, err = st.Commit(ctx, rev, change); err != nil {
				t.Fatal(err)
			}
			if got, _, err := st.Load(ctx); err != nil || len(got.Retiring)+len(got.Backends) != 0 {
				t.Fatalf("loaded %+v (err %v); want nothing", got, err)
			}
		})
	}
}
