//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestExternalBackend routes to a Consul service that something other than
// servemesh registers and runs, following its registrations and health.
func TestExternalBackend(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	// The instance named by DNS below is localhost: names need the
	// operator's leave, and localhost's addresses (127.0.0.1 and, on some
	// hosts, ::1) theirs.
	ctl := startController(t, consul, "ctl", []string{"--plaintext", "--allow-replica-name", "localhost",
		"--allow-replica-cidr", "127.0.0.0/8", "--allow-replica-cidr", "::1/128"})
	ctl.waitLeading(20 * time.Second)
	n := startEnvoy(t, "ext-node", ctl.xdsAddr, bootstrap.ProtocolSotW)
	legacy := startReplicas(t, "legacy", 2)
	consulClient, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	register := func(i int, status string) {
		host, port, _ := strings.Cut(legacy.addrs[i], ":")
		p, _ := strconv.Atoi(port)
		if err := consulClient.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID: "legacy-" + strconv.Itoa(i), Name: "legacy-api", Address: host, Port: p,
			Check: &api.AgentServiceCheck{CheckID: "legacy-check-" + strconv.Itoa(i), TTL: "1h", Status: status},
		}); err != nil {
			t.Fatal(err)
		}
	}
	register(0, api.HealthPassing)
	register(1, api.HealthCritical)

	c := ctl.client("")
	ctx := context.Background()
	if _, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "legacy", External: &meshspec.ExternalSpec{Service: "legacy-api"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "old", Route: "/old", Traffic: map[string]float64{"legacy": 1}}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + n.public + "/old"
	testutil.WaitFor(t, 15*time.Second, "Envoy to route to the external service", func() bool {
		return do(httpClient(), http.MethodGet, url, "").status == http.StatusOK
	})
	sendMany(t, url, 200)
	if got := legacy.replicas[1].Served(); got != 0 {
		t.Fatalf("the critical instance served %d requests", got)
	}
	// Its health turns passing: it joins. Deregistered: it leaves.
	if err := consulClient.Agent().UpdateTTL("legacy-check-1", "", api.HealthPassing); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "the second instance to get traffic", func() bool {
		sendMany(t, url, 20)
		return legacy.replicas[1].Served() > 0
	})
	if err := consulClient.Agent().ServiceDeregister("legacy-0"); err != nil {
		t.Fatal(err)
	}
	if err := consulClient.Agent().ServiceDeregister("legacy-1"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "Envoy to stop routing to deregistered instances", func() bool {
		return do(httpClient(), http.MethodGet, url, "").status == http.StatusServiceUnavailable
	})

	// An instance registered by DNS name the operator allows is resolved
	// by the controller, which gives Envoy its addresses; one whose
	// address is unusable is left out alone and reported. Either used to
	// make every later change go unpublished while status said in sync.
	_, port, _ := strings.Cut(legacy.addrs[0], ":")
	p, _ := strconv.Atoi(port)
	for id, addr := range map[string]string{"legacy-dns": "localhost", "legacy-junk": "not an address"} {
		if err := consulClient.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: "legacy-api", Address: addr, Port: p,
			Check: &api.AgentServiceCheck{CheckID: id + "-check", TTL: "1h", Status: api.HealthPassing}}); err != nil {
			t.Fatal(err)
		}
	}
	before := legacy.replicas[0].Served()
	testutil.WaitFor(t, 20*time.Second, "Envoy to route to the instance named by DNS", func() bool {
		return do(httpClient(), http.MethodGet, url, "").status == http.StatusOK
	})
	sendMany(t, url, 50)
	if legacy.replicas[0].Served() <= before {
		t.Fatal("the DNS-named instance did not serve")
	}
	// Later changes are still published: a new endpoint is served.
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "again", Route: "/again", Traffic: map[string]float64{"legacy": 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "a later change to be served", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+n.public+"/again", "").status == http.StatusOK
	})
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "legacy-junk") || !strings.Contains(st.Problems[0], "not an IP:port or host:port") {
		t.Fatalf("status problems %q; want the unusable instance reported", st.Problems)
	}
	if n := metricValue(t, ctl.apiAddr, "servemesh_dataplane_dropped_instances"); n != 1 {
		t.Fatalf("servemesh_dataplane_dropped_instances = %v, want 1", n)
	}
}
