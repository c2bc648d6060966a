//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// Issue 59: every way a replica is removed lets the answers it streams end
// whole. TestLongStreamsOutliveAScaleDown covers a scale-down by hand; the
// tests below a node's drain, a rollout's rollback and its promotion.

// TestLongStreamsOutliveANodeDrain: on the default mesh, answers streamed
// for 30 s through both nodes, some on the replica of n2; n2 is drained.
// Its replica is replaced on n1 and drains: no new request reaches it and
// none fails, its streams end whole, and its placement is freed once they
// have ended.
func TestLongStreamsOutliveANodeDrain(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "nodedrain")
	ctx := context.Background()
	mesh.createBackends(t, meshspec.Backend{Name: "nd", Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}, Process: demoProcess("nd", false)})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "nd", Route: "/nd", Traffic: map[string]float64{"nd": 1}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	for _, n := range nodes {
		waitReplicasAnswer(t, "both replicas to answer through "+n.id, "http://"+n.public+"/nd", 2, 60)
	}
	onN2 := invert(runningOn(placements(t, mesh.c, "nd")))[mesh.n2.id]
	streams, on := openLongStreams(t, publics(nodes...), "/nd")
	if onN2 == "" || on[onN2] == 0 {
		t.Fatalf("streams on %v, n2 runs %q; want some on n2's replica", on, onN2)
	}
	l := startLoad("http://"+mesh.n1.public+"/nd", 2)
	if _, err := mesh.c.NodeAction(ctx, mesh.n2.id, api.Drain); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "n2's replica to be replaced on n1 and drain", func() bool {
		ps := placements(t, mesh.c, "nd")
		running := invert(runningOn(ps))
		return len(runningOn(ps)) == 2 && running[mesh.n2.id] == "" && hasPlacement(t, mesh, "nd", onN2)
	})
	wantWhole(t, streams)
	l.finish(t)
	testutil.WaitFor(t, 20*time.Second, onN2+"'s placement to be freed once its streams ended", func() bool { return !hasPlacement(t, mesh, "nd", onN2) })
}

// TestLongStreamsOutliveARollbackAndAPromotion: on the default mesh, a
// rollout of v2 at half the traffic, answers streaming from both versions
// through both nodes, is aborted: the candidate's streams end whole while
// new requests go to v1 alone. Then v2 is rolled out again and promoted
// with scale_down_primary: v1's replicas drain, and their streams end
// whole; no request fails throughout.
func TestLongStreamsOutliveARollbackAndAPromotion(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "rollstreams")
	ctx := context.Background()
	mesh.createBackends(t, demoVersion("rs-v1", 2, `{}`), demoVersion("rs-v2", 2, `{}`))
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "rs", Route: "/rs", Traffic: map[string]float64{"rs-v1": 1}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	for _, n := range nodes {
		waitReplicasAnswer(t, "rs-v1's replicas to answer through "+n.id, "http://"+n.public+"/rs", 2, 60)
	}
	if _, err := mesh.c.StartRollout(ctx, "rs", meshspec.Rollout{Candidate: "rs-v2",
		Steps: []meshspec.RolloutStep{{Weight: 0.5, DurationS: 600}}, Checks: alike}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the rollout's first step to send requests to rs-v2", func() bool {
		for i := range 10 {
			if r, err := replicaOf(httpClient(), "http://"+nodes[i%2].public+"/rs"); err == nil && strings.HasPrefix(r, "rs-v2#") {
				return true
			}
		}
		return false
	})
	l := startLoad("http://"+mesh.n1.public+"/rs", 2)
	streams := streamsOnEach(t, nodes, "/rs", "rs-v1#", "rs-v2#")
	if _, err := mesh.c.ActOnRollout(ctx, "rs", meshspec.AbortRollout); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "new requests to reach rs-v1 alone after the rollback", func() bool {
		for i := range 10 {
			if r, err := replicaOf(httpClient(), "http://"+nodes[i%2].public+"/rs"); err != nil || !strings.HasPrefix(r, "rs-v1#") {
				return false
			}
		}
		return true
	})
	wantWhole(t, streams)

	if _, err := mesh.c.StartRollout(ctx, "rs", meshspec.Rollout{Candidate: "rs-v2", ScaleDownPrimary: true,
		Steps: []meshspec.RolloutStep{{Weight: 1, DurationS: 1}}, Checks: alike}); err != nil {
		t.Fatal(err)
	}
	streams = streamsOnEach(t, nodes, "/rs", "rs-v1#")
	testutil.WaitFor(t, time.Minute, "the rollout of rs-v2 to be promoted", func() bool {
		r, err := mesh.c.Rollout(ctx, "rs")
		return err == nil && r.Phase == meshspec.RolloutPromoted
	})
	testutil.WaitFor(t, 20*time.Second, "rs-v1's replicas to drain after the promotion", func() bool { return len(runningOn(placements(t, mesh.c, "rs-v1"))) == 0 })
	if len(placements(t, mesh.c, "rs-v1")) == 0 {
		t.Fatal("rs-v1's placements were dropped at the promotion, its streams still going")
	}
	wantWhole(t, streams)
	l.finish(t)
	testutil.WaitFor(t, 20*time.Second, "rs-v1's placements to be freed once its streams ended", func() bool { return len(placements(t, mesh.c, "rs-v1")) == 0 })
}

// streamsOnEach opens long streams to path through nodes in turn until
// each of prefixes (a backend's replica tags, "name#") carries one.
func streamsOnEach(t *testing.T, nodes []*mtlsNode, path string, prefixes ...string) []*longStream {
	t.Helper()
	var streams []*longStream
	carried := map[string]bool{}
	for i := 0; i < 24 && len(carried) < len(prefixes); i++ {
		s := openStream(t, longStreamURL(nodes[i%len(nodes)].public, path), i%2 == 1)
		streams = append(streams, s)
		for _, p := range prefixes {
			if strings.HasPrefix(s.replica, p) {
				carried[p] = true
			}
		}
	}
	if len(carried) < len(prefixes) {
		t.Fatalf("%d streams reached %v; want one on each of %v", len(streams), carried, prefixes)
	}
	return streams
}

// TestLongStreamsOutliveABackendsDeletion: on the default mesh, answers
// streamed from v1's replicas through both nodes; the endpoint's traffic
// moves to v2 and, once the nodes serve that, v1 is deleted. v1 leaves the users' view at once
// (status lists it as retiring, its name taken until then), but its
// replicas finish their streams whole before they stop (they were stopped
// with the deletion); no new request fails; then v1 is gone, and its name
// free again.
func TestLongStreamsOutliveABackendsDeletion(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "delstreams")
	ctx := context.Background()
	mesh.createBackends(t, demoVersion("del-v1", 2, `{}`), demoVersion("del-v2", 2, `{}`))
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "del", Route: "/del", Traffic: map[string]float64{"del-v1": 1}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	for _, n := range nodes {
		waitReplicasAnswer(t, "del-v1's replicas to answer through "+n.id, "http://"+n.public+"/del", 2, 60)
	}
	streams, on := openLongStreams(t, publics(nodes...), "/del")
	if len(on) < 2 {
		t.Fatalf("streams on %v; want some on each replica", on)
	}
	l := startLoad("http://"+mesh.n2.public+"/del", 2)
	if _, err := mesh.c.SetTraffic(ctx, "del", map[string]float64{"del-v2": 1}); err != nil {
		t.Fatal(err)
	}
	// As `traffic set --wait` does: once every node routes to v2, v1 gets
	// no new request (deleted before, the requests a node still routed to
	// it would wait for a replica it will not have).
	if err := mesh.c.WaitServed(ctx, api.ServedQuery{Endpoints: []string{"del"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.c.DeleteBackend(ctx, "del-v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.c.GetBackend(ctx, "del-v1"); err == nil {
		t.Error("del-v1 is still listed after its deletion")
	}
	if !retiring(t, mesh, "del-v1") {
		t.Error("status does not list del-v1 as retiring while its replicas finish their streams")
	}
	if _, err := mesh.c.CreateBackend(ctx, meshspec.BackendSpecOf(demoVersion("del-v1", 1, `{}`))); err == nil || !strings.Contains(err.Error(), "still finishing the requests") {
		t.Errorf("creating del-v1 again while it retires: %v; want a refusal saying why", err)
	}
	wantWhole(t, streams)
	l.finish(t)
	testutil.WaitFor(t, 20*time.Second, "del-v1 to be gone once its streams ended", func() bool { return !retiring(t, mesh, "del-v1") })
	mesh.createBackends(t, demoVersion("del-v1", 1, `{}`))
}

// retiring reports whether the status lists backend as retiring.
func retiring(t *testing.T, mesh *twoNodeMesh, backend string) bool {
	t.Helper()
	r, err := mesh.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range r.Backends {
		if b.Name == backend {
			return b.Retiring
		}
	}
	return false
}

// TestLongStreamsOutliveAnAutoscalerScaleDown: on the default mesh, an
// autoscaled backend holds two replicas while answers stream from both
// (four in flight, a target of one each, at most two, no scale-down for
// ten minutes); its target is raised to eight and its downscale delay cut
// to 2 s, so the autoscaler wants one replica and drains the other while
// its streams go on. They end whole, and the drained
// replica's placement is freed once they have.
func TestLongStreamsOutliveAnAutoscalerScaleDown(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "autostreams")
	ctx := context.Background()
	as := &meshspec.AutoscalingConfig{MinReplicas: 1, MaxReplicas: 2, InitialReplicas: 2, TargetInFlight: 1,
		MetricsIntervalS: 0.25, LookBackPeriodS: 1, UpscaleDelayS: 1, DownscaleDelayS: 600} // no scale-down before the streams
	mesh.createBackends(t, meshspec.Backend{Name: "auto", Config: meshspec.BackendConfig{CPUs: 3, Autoscaling: as}, Process: demoProcess("auto", false)})
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "auto", Route: "/auto", Traffic: map[string]float64{"auto": 1}}); err != nil {
		t.Fatal(err)
	}
	nodes := []*mtlsNode{mesh.n1, mesh.n2}
	for _, n := range nodes {
		waitReplicasAnswer(t, "both replicas to answer through "+n.id, "http://"+n.public+"/auto", 2, 60)
	}
	streams, on := openLongStreams(t, publics(nodes...), "/auto")
	if len(on) < 2 {
		t.Fatalf("streams on %v; want some on each replica", on)
	}
	wide := *as
	wide.TargetInFlight, wide.DownscaleDelayS = 8, 2
	if _, err := mesh.c.UpdateBackend(ctx, "auto", meshspec.BackendConfigPatch{Autoscaling: &wide}); err != nil {
		t.Fatal(err)
	}
	var draining string
	testutil.WaitFor(t, 20*time.Second, "the autoscaler to drain one of the two replicas", func() bool {
		for _, p := range placements(t, mesh.c, "auto") {
			if p.State == meshspec.Draining {
				draining = p.Tag
				return true
			}
		}
		return false
	})
	if on[draining] == 0 {
		t.Fatalf("the autoscaler drained %s, which carries none of the streams (%v)", draining, on)
	}
	wantWhole(t, streams)
	testutil.WaitFor(t, 20*time.Second, draining+"'s placement to be freed once its streams ended", func() bool { return !hasPlacement(t, mesh, "auto", draining) })
}
