package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestConsoleFiles: the page and its script are served with a policy
// that runs no inline or foreign code and forbids framing; nothing but
// GET is answered.
func TestConsoleFiles(t *testing.T) {
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)
	for path, want := range map[string]string{Path: `<script src="console.js"`, Path + "console.js": "textContent", Path + "console.css": ".bar"} {
		resp, err := http.Get(srv.URL + path) //nolint:noctx // a test
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d, %q", path, resp.StatusCode, body)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Fatalf("GET %s: Content-Security-Policy %q", path, csp)
		}
	}
	resp, err := http.Post(srv.URL+Path, "text/plain", strings.NewReader("x")) //nolint:noctx // a test
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s: %d", Path, resp.StatusCode)
	}
}

// TestScriptWritesNoMarkup: the script puts what the API says into the
// page as text only.
func TestScriptWritesNoMarkup(t *testing.T) {
	js, err := static.ReadFile("static/console.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		if strings.Contains(string(js), sink) {
			t.Errorf("console.js uses %s", sink)
		}
	}
}
