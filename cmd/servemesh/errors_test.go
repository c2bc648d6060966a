package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/servemesh/servemesh/controlplane/api"
)

// TestControllerErrorsWithoutHTTPStatus: a controller's refusal reads as
// its message, which names the fix; the HTTP status and the error's kind
// come with -v alone (issue 40: every CLI error ended in "(HTTP 4xx)").
func TestControllerErrorsWithoutHTTPStatus(t *testing.T) {
	unsetClientEnv(t)
	msg := `backend "model-v9" is not registered; did you mean "model-v1"? backends: model-v1, model-v2`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: msg, Kind: "not_found"})
	}))
	defer srv.Close()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"backend", "get", "model-v9", "--server", srv.URL}, "servemesh backend get: " + msg + "\n"},
		{[]string{"backend", "get", "model-v9", "--server", srv.URL, "-v"}, "servemesh backend get: " + msg + " (HTTP 404, not_found)\n"},
	} {
		code, _, errOut := runCLI(c.args...)
		if code != 1 || errOut != c.want {
			t.Errorf("servemesh %v: code %d, stderr %q; want 1 and %q", c.args, code, errOut, c.want)
		}
	}
}
