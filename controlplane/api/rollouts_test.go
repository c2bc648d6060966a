package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

// TestRolloutPaths: start answers 201 then changed=false; the report
// names the stages; a status in the body, an unknown action and an
// endpoint without a rollout are refused with what to do; abort ends it.
func TestRolloutPaths(t *testing.T) {
	f := newFixture(t, "")
	ctx := context.Background()
	for _, b := range []string{"v1", "v2"} {
		if _, err := f.c.CreateBackend(ctx, meshspec.BackendSpec{Name: b, Replicas: []meshspec.ReplicaSpec{{Address: "10.0.0.1:9000"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "gen", Traffic: map[string]float64{"v1": 1}}); err != nil {
		t.Fatal(err)
	}
	base := f.srv.URL + "/v1/endpoints/gen/rollout"
	if code, body := raw(t, http.MethodGet, base, "", ""); code != http.StatusNotFound || !strings.Contains(body, "servemesh rollout start gen") {
		t.Fatalf("no rollout yet: %d %s", code, body)
	}
	spec := `{"candidate": "v2", "steps": [{"weight": 0.5, "duration_s": 60}, {"weight": 1, "duration_s": 60}]}`
	if code, body := raw(t, http.MethodPost, base, `{"candidate": "v2", "steps": [{"weight": 1}], "status": {"phase": "promoted"}}`, ""); code != http.StatusBadRequest || !strings.Contains(body, "servemesh's to set") {
		t.Fatalf("a status in the body: %d %s", code, body)
	}
	if code, body := raw(t, http.MethodPost, base, spec, ""); code != http.StatusCreated {
		t.Fatalf("start: %d %s", code, body)
	}
	if code, body := raw(t, http.MethodPost, base, spec, ""); code != http.StatusOK || !strings.Contains(body, `"changed":false`) {
		t.Fatalf("start again: %d %s", code, body)
	}
	c := NewClient(strings.TrimPrefix(f.srv.URL, "http://"), "")
	r, err := c.Rollout(ctx, "gen")
	if err != nil || r.Phase != meshspec.RolloutWaiting || r.Primary != "v1" || strings.Join(r.Stages, ",") != "traffic 50%,traffic 100%" || r.Checks.MaxErrorRate != 0.01 {
		t.Fatalf("report: %+v, %v", r, err)
	}
	if code, body := raw(t, http.MethodPost, base+"/skip", "", ""); code != http.StatusBadRequest || !strings.Contains(body, "pause") {
		t.Fatalf("an unknown action: %d %s", code, body)
	}
	if changed, err := c.ActOnRollout(ctx, "gen", meshspec.AbortRollout); err != nil || !changed {
		t.Fatalf("abort: %v %v", changed, err)
	}
	if r, err := c.Rollout(ctx, "gen"); err != nil || r.Phase != meshspec.RolloutRolledBack || r.Reason != "aborted by a user" {
		t.Fatalf("after abort: %+v, %v", r, err)
	}
}
