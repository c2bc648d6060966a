package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/testutil"
)

// TestClientErrorsSayWhatToDo: each mistake a user makes with the API's
// address gets an error that names the address once and the fix.
func TestClientErrorsSayWhatToDo(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{}`)) })
	tlsServer := httptest.NewTLSServer(ok)
	defer tlsServer.Close()
	plain := httptest.NewServer(ok)
	defer plain.Close()
	tlsAddr := strings.TrimPrefix(tlsServer.URL, "https://")
	free := testutil.MustFreeAddr("127.0.0.1")
	for name, tc := range map[string]struct {
		server string
		want   []string
	}{
		"nothing listens":          {free, []string{"at http://" + free + ":", "is a controller running there?", "--server"}},
		"http to an HTTPS API":     {tlsAddr, []string{"serves HTTPS: use https://" + tlsAddr, "--ca-file"}},
		"https without its CA":     {tlsServer.URL, []string{"does not trust", "--ca-file"}},
		"https to a plain API":     {strings.Replace(plain.URL, "http://", "https://", 1), []string{"serves plain HTTP", "use " + plain.URL}},
		"a name that resolves not": {"no-such-host.invalid:1", []string{"does not resolve", "--server"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := NewClient(tc.server, "")
			waited := false
			c.Waiting = func(error, time.Duration) { waited = true }
			start := time.Now()
			_, err := c.Leader(context.Background())
			if err == nil {
				t.Fatal("the call succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "://"); n > 1+strings.Count(strings.Join(tc.want, " "), "://") {
				t.Errorf("error %q repeats the address", err)
			}
			if waited || time.Since(start) > c.FailoverWait/2 {
				t.Errorf("one controller that cannot be used: the call waited (%s) for a failover", time.Since(start))
			}
		})
	}
}
