package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestTheAgentFollowsNoRedirect: a replica answering its probe or its
// user_config with a redirect sent its agent wherever it named, the
// node's Consul or another replica's port included (issue 34). Now the
// 3xx is the answer: the probe fails and the config is not taken, and the
// named server sees nothing.
func TestTheAgentFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { elsewhere.Add(1) }))
	defer target.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	_, portText, _ := net.SplitHostPort(redirecting.Listener.Addr().String())
	port, _ := strconv.Atoi(portText)
	a := testAgent(t)
	r := a.newReplica("b", "b#000001", meshspec.ProcessSpec{HealthPath: "/health", ReconfigurePath: "/-/reconfigure"}, false, port)
	if err := r.check(context.Background()); err == nil {
		t.Fatal("a probe answered 307 passed")
	}
	r.setConfig(meshspec.UserConfig(`{"threshold": 0.5}`))
	if err := r.reconfigure(context.Background()); err == nil {
		t.Fatal("a config answered 307 was taken")
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the agent followed %d redirects", n)
	}
}
