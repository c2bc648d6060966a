package meshspec

import (
	"strings"
	"testing"
)

// TestPatchEndpoint: a merge patch changes the fields it names and
// nothing else, null removes a field, and what the patch may not change
// (the name, the rollout) or the endpoint has no field for is refused by
// name.
func TestPatchEndpoint(t *testing.T) {
	e := Endpoint{Name: "chat", Route: "/chat", Methods: []string{"POST"}, Traffic: map[string]float64{"a": 1}, TimeoutS: 30,
		Retry: &RetryPolicy{On: []string{"503"}, Attempts: 2}, Rollout: &Rollout{Candidate: "b"}}
	got, err := PatchEndpoint(e, []byte(`{"route": "/v2/chat", "timeout_s": null, "retry": {"attempts": 3}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "chat" || got.Route != "/v2/chat" || got.TimeoutS != 0 || got.Retry.Attempts != 3 || len(got.Retry.On) != 1 ||
		got.Methods[0] != "POST" || got.Traffic["a"] != 1 || got.Rollout == nil || got.Rollout.Candidate != "b" {
		t.Fatalf("patched: %+v", got)
	}
	if e.Route != "/chat" || e.TimeoutS != 30 {
		t.Fatalf("the patch changed its input: %+v", e)
	}
	for patch, want := range map[string]string{
		`{"name": "other"}`:       "name: an endpoint keeps its name",
		`{"rollout": null}`:       "rollout: start, pause, promote or abort a rollout with servemesh rollout",
		`{"routes": "/x"}`:        `unknown field "routes"`,
		`["route"]`:               "want a JSON object of the endpoint's fields",
		`{"timeout_s": "thirty"}`: "the patch:",
	} {
		if _, err := PatchEndpoint(e, []byte(patch)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("patch %s: %v, want an error saying %q", patch, err, want)
		}
	}
}
