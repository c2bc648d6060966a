//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/internal/testutil"
)

// TestHTTPRouteApplied: a config file whose backends are servemesh's and
// whose endpoint is a Gateway API HTTPRoute, applied with the CLI to the
// default mesh (mTLS, replicas on two nodes): a header match sends its
// requests to the canary, the rest split 3:1 by the backendRefs' weights,
// and the RequestMirror filter mirrors half of them to the shadow.
func TestHTTPRouteApplied(t *testing.T) {
	t.Parallel()
	mesh := startTwoNodeMesh(t, "gwapi")
	process := func(name string) string {
		return fmt.Sprintf("{name: %s, config: {num_replicas: 2, cpus: 1}, process: {command: %q, args: [demo-replica, --backend, %s, --listen, \"${HOST}:${PORT}\"], health_path: /}}",
			name, servemeshBin, name)
	}
	file := filepath.Join(t.TempDir(), "mesh.yaml")
	writeFile(t, file, []byte(fmt.Sprintf(`backends:
  - %s
  - %s
  - %s
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: gw}
spec:
  parentRefs: [{name: servemesh}]
  rules:
    - matches: [{path: {value: /gw}, headers: [{name: x-canary, value: "yes"}]}]
      backendRefs: [{name: canary}]
    - matches: [{path: {value: /gw}, method: GET}]
      backendRefs: [{name: stable, weight: 3}, {name: canary, weight: 1}]
      filters:
        - type: RequestMirror
          requestMirror: {backendRef: {name: shadow}, percent: 50}
`, process("stable"), process("canary"), process("shadow"))))
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	testutil.WaitFor(t, 30*time.Second, "the nodes to take the backends", func() bool {
		code, _, _ := cli(t, env, "apply", "-f", file)
		return code == 0
	})
	url := "http://" + mesh.n1.public + "/gw"
	waitReplicasAnswer(t, "the route to answer", url, 4, 40)
	for range 30 {
		if r := do(httpClient(), http.MethodGet, url, ""); r.status != 200 {
			t.Fatalf("GET /gw: %v", r)
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req.Header.Set("x-canary", "yes")
	for range 30 {
		resp, err := httpClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if got := resp.Header.Get(demoreplica.BackendHeader); resp.StatusCode != 200 || got != "canary" {
			t.Fatalf("GET /gw with x-canary: yes: %d from %q; want 200 from the canary", resp.StatusCode, got)
		}
	}
	checkSplitAndMirror(t, mesh.n1, url, 400, "canary", 0.25, "shadow", 0.5)
	if code, out, errOut := cli(t, env, "apply", "-f", file, "--dry-run"); code != 0 {
		t.Fatalf("apply --dry-run again: %d %s %s", code, out, errOut)
	}
}
