//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	smapi "github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestStrayKeysDoNotStopTheController reproduces what the Consul UI's
// "create folder" does under the state's prefix (an empty key ending in
// "/"), plus other stray keys: every write used to make the controller exit,
// and every restart too. Now they are reported (status, metric) and the
// valid state keeps being served and written.
func TestStrayKeysDoNotStopTheController(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", nil)
	ctl.waitLeading(20 * time.Second)
	env := []string{"SERVEMESH_SERVER=" + ctl.apiAddr}
	v1 := startReplicas(t, "v1", 1)
	expectCLI(t, env, 0, "backend v1 created", "backend", "create", "v1", "--replica", v1.addrs[0])

	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	// An endpoint naming a backend the store lacks is left out until the
	// backend is stored (by hand, or restored from a backup in parts).
	orphan := `{"schema": 1, "endpoint": {"name": "orphan", "route": "/orphan", "traffic": {"late": 1}}}`
	for key, value := range map[string]string{"servemesh/backends/": "", "servemesh/notes": "hello", "servemesh/endpoints/bad": "{", "servemesh/endpoints/orphan": orphan} {
		if _, err := client.KV().Put(&api.KVPair{Key: key, Value: []byte(value)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	expectCLI(t, env, 0, "endpoint api created", "endpoint", "create", "api", "--route", "/api", "--backend", "v1")
	if ctl.exited() {
		t.Fatal("the controller exited after a write over stray keys")
	}
	ctl.kill()
	ctl.start()
	ctl.waitLeading(20 * time.Second)
	v2 := startReplicas(t, "v2", 1)
	expectCLI(t, env, 0, "backend v2 created", "backend", "create", "v2", "--replica", v2.addrs[0])
	expectCLI(t, env, 0, "traffic set", "traffic", "set", "api", "v1=0.5", "v2=0.5")
	out := expectCLI(t, env, 0, "PROBLEMS", "status")
	for _, key := range []string{"servemesh/backends/ ", "servemesh/notes ", "servemesh/endpoints/bad "} {
		if !strings.Contains(out, "stored key "+key) {
			t.Errorf("status does not report %q:\n%s", key, out)
		}
	}
	if n := metricValue(t, ctl.apiAddr, "servemesh_store_unreadable_keys"); n != 4 {
		t.Errorf("servemesh_store_unreadable_keys = %v, want 4", n)
	}
	if !strings.Contains(out, `stored key servemesh/endpoints/orphan `) || !strings.Contains(out, `uses backend "late"`) {
		t.Errorf("status does not report the endpoint naming a missing backend:\n%s", out)
	}
	if out := expectCLI(t, env, 0, "api", "endpoint", "list"); strings.Contains(out, "orphan") {
		t.Fatalf("an endpoint naming a missing backend is listed:\n%s", out)
	}
	// Its backend stored, the endpoint is read and served at once (the
	// controller does not read its own commits back: it did not, until
	// another writer's commit or a restart).
	late := startReplicas(t, "late", 1)
	expectCLI(t, env, 0, "backend late created", "backend", "create", "late", "--replica", late.addrs[0])
	expectCLI(t, env, 0, "orphan", "endpoint", "list")
	out = expectCLI(t, env, 0, "PROBLEMS", "status")
	if strings.Contains(out, "servemesh/endpoints/orphan") {
		t.Errorf("status still reports the endpoint whose backend is stored now:\n%s", out)
	}
	if n := metricValue(t, ctl.apiAddr, "servemesh_store_unreadable_keys"); n != 3 {
		t.Errorf("servemesh_store_unreadable_keys = %v, want 3", n)
	}
	pair, _, err := client.KV().Get("servemesh/notes", nil)
	if err != nil || pair == nil || string(pair.Value) != "hello" {
		t.Errorf("a stray key was changed: %+v %v", pair, err)
	}
}

// sendAndHangUp sends a whole POST of body to addr, then closes the
// connection without reading the answer, as a client that gives up does.
func sendAndHangUp(t *testing.T, addr, path string, body any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	conn, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, addr, len(b))
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
}

// TestLargeApplyIsAtomicAndReadsGoOn applies thousands of objects, more than
// one Consul transaction holds, from a client that gives up at once. It
// used to leave most objects deleted and the rest not, and every read
// waited for the whole apply. Now every reader of the store sees the old
// state or the new one, never a mix; the apply completes although its client
// left; and reads are answered throughout.
func TestLargeApplyIsAtomicAndReadsGoOn(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ctl := startController(t, consul, "ctl", nil)
	ctl.waitLeading(20 * time.Second)
	const n = 3000
	big := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9"}}}}}
	for i := range n {
		big.Endpoints = append(big.Endpoints, meshspec.Endpoint{Name: fmt.Sprintf("e%d", i), Traffic: map[string]float64{"b": 1}})
	}
	c := ctl.client("")
	if _, err := c.Apply(context.Background(), meshspec.SpecOf(&meshspec.Model{Backends: big.Backends, Endpoints: big.Endpoints[:10]}), smapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	observer := store.NewConsul(client, "servemesh", slog.New(slog.DiscardHandler))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seen sync.Map // endpoint counts observed
	var reads, failedReads atomic.Int64
	wg.Add(2)
	go func() { // a store reader: old (10 endpoints) or new (n), nothing else
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if m, _, err := observer.Load(context.Background()); err == nil {
				seen.Store(len(m.Endpoints), true)
			}
		}
	}()
	go func() { // API reads keep being answered
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.Leader(ctx)
			if err == nil {
				_, err = c.ListBackends(ctx)
			}
			cancel()
			reads.Add(1)
			if err != nil {
				failedReads.Add(1)
			}
		}
	}()
	// The client sends the whole apply, then hangs up without waiting for
	// the answer; the controller carries on.
	sendAndHangUp(t, ctl.apiAddr, "/v1/apply", big)
	testutil.WaitFor(t, 60*time.Second, "the apply to be stored", func() bool {
		m, _, err := observer.Load(context.Background())
		return err == nil && len(m.Endpoints) == n
	})
	testutil.WaitFor(t, 60*time.Second, "the apply's record to be cleared once applied", func() bool {
		keys, _, err := client.KV().Keys("servemesh/pending/", "", nil)
		return err == nil && len(keys) == 0
	})
	close(stop)
	wg.Wait()
	seen.Range(func(k, _ any) bool {
		if k.(int) != 10 && k.(int) != n {
			t.Errorf("a reader of the store saw %d endpoints: a mix of the old state (10) and the new (%d)", k.(int), n)
		}
		return true
	})
	if reads.Load() == 0 || failedReads.Load() > 0 {
		t.Errorf("API reads during the apply: %d, %d failed", reads.Load(), failedReads.Load())
	}
}
