//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestLongStreamsOutliveAScaleDown: issue 59. On the default mesh (mTLS,
// two nodes, a replica on each), answers streamed for 30 s through both
// nodes, some on each replica; the backend is scaled down to one while
// they stream. The removed replica gets no new request, but finishes its
// streams whole (it was stopped 5 s into its drain, cutting them); its
// placement, and the node's resources, are freed once they have ended,
// not before; and its agent says it drained with nothing in flight.
func TestLongStreamsOutliveAScaleDown(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "drains")
	ctx := context.Background()
	mesh.createBackends(t, meshspec.Backend{Name: "long", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}, Process: demoProcess("long", false)})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "long", Route: "/long", Traffic: map[string]float64{"long": 1}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	for _, n := range nodes {
		waitReplicasAnswer(t, "both replicas to answer through "+n.id, "http://"+n.public+"/long", 2, 60)
	}

	streams, on := openLongStreams(t, publics(nodes...), "/long")
	if len(on) < 2 {
		t.Fatalf("streams on %v; want some on each replica", on)
	}
	one := 1
	if _, err := mesh.c.UpdateBackend(ctx, "long", meshspec.BackendConfigPatch{NumReplicas: &one}); err != nil {
		t.Fatal(err)
	}
	scaledDown := time.Now()
	var draining, survivor string
	for _, p := range placements(t, mesh.c, "long") {
		if p.State == meshspec.Draining {
			draining = p.Tag
		} else {
			survivor = p.Tag
		}
	}
	if draining == "" || survivor == "" || on[draining] == 0 {
		t.Fatalf("after scaling down: draining %q (%d streams on it), running %q; want one of each, streams on the draining one", draining, on[draining], survivor)
	}

	// New requests reach the survivor alone, through both nodes, once the
	// nodes have the change; none fails.
	testutil.WaitFor(t, 20*time.Second, "new requests to reach "+survivor+" alone", func() bool {
		for i := range 10 {
			replica, err := replicaOf(httpClient(), "http://"+nodes[i%2].public+"/long")
			if err != nil {
				t.Fatalf("a new request while %s drains: %v", draining, err)
			}
			if replica != survivor {
				return false
			}
		}
		return true
	})
	// Status and node list say what it is finishing.
	testutil.WaitFor(t, 10*time.Second, "status and node list to show the requests "+draining+" is finishing", func() bool {
		return drainingInFlight(t, mesh, "long", draining) > 0 && nodeDrainingRequests(t, mesh, draining) > 0
	})
	// Well past the drain grace (1 s here), its streams still going, the
	// draining replica keeps its placement.
	for time.Since(scaledDown) < 8*time.Second {
		time.Sleep(200 * time.Millisecond)
	}
	if !hasPlacement(t, mesh, "long", draining) {
		t.Fatalf("%s's placement was dropped %s into its drain, with its streams still going", draining, time.Since(scaledDown).Round(time.Second))
	}

	wantWhole(t, streams)
	ended := time.Now()
	testutil.WaitFor(t, 20*time.Second, draining+"'s placement to be freed once its streams ended", func() bool { return !hasPlacement(t, mesh, "long", draining) })
	t.Logf("the drained replica's placement was freed %s after its streams ended (%s after the scale-down)",
		time.Since(ended).Round(100*time.Millisecond), time.Since(scaledDown).Round(100*time.Millisecond))
	logs := mesh.n1.stderr.String() + mesh.n2.stderr.String()
	if !strings.Contains(logs, "replica drained: no request in flight") || strings.Contains(logs, "graceful shutdown timeout") {
		t.Errorf("the agents' logs do not say %s drained with nothing in flight (or say a drain was cut)", draining)
	}
}

// longStreamTokens and longStreamEvery make the e2e's long streams: 300 tokens,
// one every 100 ms, 30 s in all.
const (
	longStreamTokens = 300
	longStreamEvery  = 100 * time.Millisecond
)

// openLongStreams opens at least four long streams to path, through each
// of nodes (public listener addresses) in turn, chunked and server-sent
// events alternately, until they reach at least two replicas (or sixteen
// are open); it returns them and how many each replica carries.
func openLongStreams(t *testing.T, nodes []string, path string) ([]*longStream, map[string]int) {
	t.Helper()
	var streams []*longStream
	on := map[string]int{}
	for i := 0; i < 16 && (len(on) < 2 || len(streams) < 4); i++ {
		s := openStream(t, longStreamURL(nodes[i%len(nodes)], path), i%2 == 1)
		streams = append(streams, s)
		on[s.replica]++
	}
	return streams, on
}

// longStreamURL asks the demo replicas behind public (a node's public
// listener) for a long stream at path.
func longStreamURL(public, path string) string {
	return fmt.Sprintf("http://%s%s?tokens=%d&every_ms=%d", public, path, longStreamTokens, longStreamEvery.Milliseconds())
}

// publics are nodes' public listener addresses.
func publics(nodes ...*mtlsNode) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.public
	}
	return out
}

// wantWhole waits for streams to end and fails the test for each that
// did not end whole.
func wantWhole(t *testing.T, streams []*longStream) {
	t.Helper()
	for i, s := range streams {
		got := <-s.done
		if got.err != nil || len(got.tokens) != longStreamTokens || got.tokens[longStreamTokens-1] != fmt.Sprintf("token %d", longStreamTokens-1) {
			t.Errorf("stream %d (on %s, opened %s, ended %s): %d of %d tokens, error %v; want it whole", i, s.replica,
				s.opened.Format("15:04:05.000"), got.ended.Format("15:04:05.000"), len(got.tokens), longStreamTokens, got.err)
		}
	}
}

// drainingInFlight is what the status says replica tag of backend is
// finishing (-1: it says nothing).
func drainingInFlight(t *testing.T, mesh *twoNodeMesh, backend, tag string) int {
	t.Helper()
	r, err := mesh.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Backends {
		for _, rep := range b.Replicas {
			if b.Name == backend && rep.Tag == tag && rep.InFlight != nil {
				return *rep.InFlight
			}
		}
	}
	return -1
}

// nodeDrainingRequests is what node list says the node of replica tag
// has in flight to its draining replicas.
func nodeDrainingRequests(t *testing.T, mesh *twoNodeMesh, tag string) int {
	t.Helper()
	node := ""
	for _, p := range placements(t, mesh.c, strings.SplitN(tag, "#", 2)[0]) {
		if p.Tag == tag {
			node = p.Node
		}
	}
	nodes, err := mesh.c.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == node {
			return n.DrainingRequests
		}
	}
	return 0
}

// hasPlacement reports whether backend still has a placement tagged tag.
func hasPlacement(t *testing.T, mesh *twoNodeMesh, backend, tag string) bool {
	t.Helper()
	for _, p := range placements(t, mesh.c, backend) {
		if p.Tag == tag {
			return true
		}
	}
	return false
}

// longStream is a streamed answer being read: its replica, known from its
// headers, and done, which receives what the whole stream read.
type longStream struct {
	replica string
	opened  time.Time
	done    chan streamRead
}

type streamRead struct {
	tokens []string
	err    error
	ended  time.Time
}

// openStream sends a streaming request (server-sent events if sse) and
// returns once its answer's headers have come; the tokens are read on.
func openStream(t *testing.T, url string, sse bool) *longStream {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sse {
		req.Header.Set("Accept", "text/event-stream")
	}
	// Each stream has a connection of its own, closed once it has been read.
	tr := &http.Transport{DisableKeepAlives: true}
	resp, err := (&http.Client{Timeout: 2 * time.Minute, Transport: tr}).Do(req) //nolint:bodyclose // the goroutine reading the stream closes it
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	s := &longStream{replica: resp.Header.Get(demoreplica.ReplicaHeader), opened: time.Now(), done: make(chan streamRead, 1)}
	go func() {
		defer func() { _ = resp.Body.Close() }()
		var got streamRead
		got.err = scanTokens(resp.Body, sse, func(token string) { got.tokens = append(got.tokens, token) })
		got.ended = time.Now()
		s.done <- got
	}()
	return s
}

// TestLongStreamsOutliveEnvoyUpgrades: issue 59. On the default mesh,
// answers streamed for 30 s through both nodes while each node's agent is
// restarted with another Envoy setting, which hot restarts its Envoy (as
// an Envoy upgrade does): the old Envoy, which carries the streams, serves
// them to their end (it was ended 5 s after its drain, cutting them all)
// while the new one takes every new request, and is ended at its upgrade
// grace (45 s here). n1's agent is then restarted with yet another
// setting while the streams go on: a third epoch would make the second
// end the first at once, cutting them, so that hot restart waits until
// the first Envoy holds no connection (idle ones included) or has ended.
func TestLongStreamsOutliveEnvoyUpgrades(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "upgrades")
	ctx := context.Background()
	mesh.createBackends(t, meshspec.Backend{Name: "long", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 3}, Process: demoProcess("long", false)})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "long", Route: "/long", Traffic: map[string]float64{"long": 1}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	first := map[string]dataPlane{}
	for _, n := range nodes {
		waitReplicasAnswer(t, "both replicas to answer through "+n.id, "http://"+n.public+"/long", 2, 60)
		first[n.id] = dataPlaneOf(t, mesh, n)
	}
	streams, on := openLongStreams(t, publics(nodes...), "/long")
	if len(on) < 2 {
		t.Fatalf("streams on %v; want some on each replica", on)
	}
	l := startLoad("http://"+mesh.n1.public+"/long", 2)
	withSetting := func(n *mtlsNode, level string) []string {
		return append(append([]string{}, n.args...), "--envoy-log-level", level, "--envoy-upgrade-grace", "45s")
	}
	for _, n := range nodes {
		restartAgent(t, n.agentProc, false, 1, withSetting(n, "warning"))
		if now := dataPlaneOf(t, mesh, n); now.epoch != first[n.id].epoch+1 || now.envoy == first[n.id].envoy {
			t.Fatalf("node %s: envoy pid %d epoch %d, before pid %d epoch %d: want a hot restart", n.id, now.envoy, now.epoch, first[n.id].envoy, first[n.id].epoch)
		}
	}
	before := len(mesh.n1.stderr.String())
	restartAgent(t, mesh.n1.agentProc, false, 1, withSetting(mesh.n1, "error"))
	if log := mesh.n1.stderr.String()[before:]; !strings.Contains(log, "envoy hot restart deferred") {
		t.Errorf("n1's agent, restarted with another setting while its first envoy serves streams, does not say it defers the hot restart:\n%s", log)
	}
	if now := dataPlaneOf(t, mesh, mesh.n1); now.epoch != first[mesh.n1.id].epoch+1 {
		t.Errorf("n1's envoy is at epoch %d while the first one serves streams; want %d (the hot restart deferred)", now.epoch, first[mesh.n1.id].epoch+1)
	}

	wantWhole(t, streams)
	l.finish(t)
	streamsEnded := time.Now()
	for _, n := range nodes {
		if _, err := proc.IdentityOf(first[n.id].envoy); err != nil {
			t.Errorf("node %s's first envoy ended before its upgrade grace passed (%v)", n.id, err)
		}
	}
	testutil.WaitFor(t, 90*time.Second, "n1's first envoy to end at its grace and the deferred hot restart to go ahead", func() bool {
		_, err := proc.IdentityOf(first[mesh.n1.id].envoy)
		return dataPlaneOf(t, mesh, mesh.n1).epoch == first[mesh.n1.id].epoch+2 && err != nil
	})
	t.Logf("n1's deferred hot restart went ahead %s after the streams ended", time.Since(streamsEnded).Round(time.Second))
	waitReplicasAnswer(t, "both replicas to answer through n1 after its second hot restart", "http://"+mesh.n1.public+"/long", 2, 60)
}
