//go:build e2e

package e2e

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestEnvoyNACKIsReportedNotResent gives Envoy a listener it cannot bind (the
// port is taken), so the real Envoy rejects it. The control plane must log
// Envoy's error, count it, show it in the node's status, and not send the
// rejected config again; the endpoints that do work keep working.
func TestEnvoyNACKIsReportedNotResent(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, "a", 1)
	config := filepath.Join(t.TempDir(), "mesh.yaml")
	writeModel(t, config, &meshspec.Model{
		Backends:  []meshspec.Backend{a.backendModel()},
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 1}}},
	})
	cp := startControlPlane(t, config)

	// Occupy the port the node's public listener will ask for.
	var lc net.ListenConfig
	squatter, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = squatter.Close() }()
	n := startEnvoyWithPublic(t, "nack-node", cp.xdsAddr, bootstrap.ProtocolSotW, squatter.Addr().String())

	testutil.WaitFor(t, 15*time.Second, "the NACK to show in the node status", func() bool {
		nodes := nodesOf(cp.httpAddr)
		return len(nodes) == 1 && nodes[0].NACKs > 0
	})
	status := mustNodes(t, cp.httpAddr)[0]
	t.Logf("node status after the NACK: nacks=%d in_sync=%v last_nack=%q", status.NACKs, status.InSync, status.LastNACK)
	if status.InSync || !strings.Contains(status.LastNACK, "listeners") || !strings.Contains(strings.ToLower(status.LastNACK), "bind") {
		t.Fatalf("status %+v: want out of sync, with Envoy's bind error on listeners", status)
	}
	if !strings.Contains(cp.stderr.String(), "envoy rejected configuration (NACK)") {
		t.Fatal("the control plane did not log the NACK")
	}
	nacks := metricValue(t, cp.httpAddr, "servemesh_xds_nacks_total", "type", "listeners")
	pushes := metricValue(t, cp.httpAddr, "servemesh_xds_pushes_total", "type", "listeners")
	if nacks < 1 {
		t.Fatalf("servemesh_xds_nacks_total{type=listeners} = %v, want >= 1", nacks)
	}
	time.Sleep(2 * time.Second) // a resend loop would push many times meanwhile
	if again := metricValue(t, cp.httpAddr, "servemesh_xds_pushes_total", "type", "listeners"); again != pushes {
		t.Fatalf("listener pushes went from %v to %v with no change: the rejected config is being re-sent", pushes, again)
	}
	// The mesh listener was accepted and serves.
	client := &http.Client{Timeout: 5 * time.Second}
	if r := do(client, http.MethodGet, "http://"+n.mesh+"/", "svc"); r.status != http.StatusOK || r.backend != "a" {
		t.Fatalf("mesh listener after a partial NACK: %+v", r)
	}
}
