package api

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"path"
	"strings"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/internal/httpserver"
)

// Scope is what a bearer token allows; a wider scope includes the
// narrower ones.
type Scope int

// The scopes, narrowest first.
const (
	// ScopeRead allows reads: the state, status, the leader, /metrics and
	// /v1/xds/nodes.
	ScopeRead Scope = iota + 1
	// ScopeWrite allows changes, except those that run commands.
	ScopeWrite
	// ScopeExec allows creating or changing a backend's command: code
	// execution on every node that runs its replicas.
	ScopeExec
)

func (s Scope) String() string {
	switch s {
	case ScopeRead:
		return "read"
	case ScopeWrite:
		return "write"
	case ScopeExec:
		return "exec"
	}
	return "none"
}

// Tokens maps each bearer token to its scope. Empty: no authentication,
// every caller has every scope (loopback only; see the controller).
type Tokens map[string]Scope

// Add reads a token file (its first line, trimmed) into t with scope; an
// empty path adds nothing.
func (t Tokens) Add(path string, scope Scope) error {
	if path == "" {
		return nil
	}
	token, err := ReadTokenFile(path)
	if err != nil {
		return err
	}
	if prev, ok := t[token]; ok && prev != scope {
		return fmt.Errorf("token file %s holds the token of another scope (%s); give each scope its own token", path, prev)
	}
	t[token] = scope
	return nil
}

type scopeKey struct{}

// ScopeOf is the scope the request's token allows.
func ScopeOf(ctx context.Context) Scope {
	if s, ok := ctx.Value(scopeKey{}).(Scope); ok {
		return s
	}
	return 0
}

// ConsolePath is where the controller serves its web console
// (controlplane/console), whose files need no token.
const ConsolePath = "/ui/"

// isConsoleFile reports whether p names the console or one of its files:
// a clean path under ConsolePath (no "..", which the mux would clean to
// another path).
func isConsoleFile(p string) bool {
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean == p && strings.HasPrefix(p+"/", ConsolePath)
}

// Authenticate requires a token of at least the read scope for GET and HEAD
// and of the write scope for anything else, on every path but /healthz and
// the console's static files (GET under ConsolePath), and records the
// token's scope for handlers that need more (ScopeOf). Without tokens
// every request has every scope.
func (t Tokens) Authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(t) == 0 {
			if msg := fromABrowser(r); msg != "" {
				writeError(w, http.StatusForbidden, "forbidden", msg, "")
				return
			}
			next.ServeHTTP(w, r.WithContext(withScope(r.Context(), ScopeExec)))
			return
		}
		if r.URL.Path == "/healthz" || (r.Method == http.MethodGet || r.Method == http.MethodHead) && isConsoleFile(r.URL.Path) {
			next.ServeHTTP(w, r) // the console's files are static; its script sends the token
			return
		}
		scope := t.scopeOf(r)
		need := ScopeWrite
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			need = ScopeRead
		}
		switch {
		case scope == 0:
			w.Header().Set("WWW-Authenticate", `Bearer realm="servemesh"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token: send one of the controller's tokens, as the header Authorization: Bearer <token> (the servemesh CLI sends the one in --token-file or $SERVEMESH_TOKEN_FILE)", "")
		case scope < need:
			writeError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("this token has the %s scope; %s %s needs %s", scope, r.Method, r.URL.Path, need), "")
		default:
			next.ServeHTTP(w, r.WithContext(withScope(r.Context(), scope)))
		}
	})
}

// fromABrowser says why a request to an API without tokens may come from a
// web page rather than a local client, or returns "". Such an API trusts
// whoever reaches it, so a page must not reach it through the browser: a
// request with an Origin header (a page's fetch or form, CSRF), or one that
// reached a loopback address naming another host (DNS rebinding), is
// refused.
//
// A page of the API's own origin (its console, which only this API serves
// there) is not refused: its Origin names the loopback host and port the
// request reached, which no other page's does.
func fromABrowser(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" && !sameLoopbackOrigin(o, r) {
		return fmt.Sprintf("a request with an Origin header (%q) comes from a web page, and this API has no token; call it from a client such as the servemesh CLI, or give the controller tokens (--token-file)", o)
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if local == nil || !httpserver.IsLoopback(local.String()) {
		return "" // served beyond loopback without a token: --insecure said so
	}
	if !httpserver.IsLoopback(r.Host) && !httpserver.IsLoopback(r.Host+":0") {
		return fmt.Sprintf("this API listens on loopback without a token and answers only to a loopback host (localhost, 127.0.0.1, [::1]), not %q (DNS rebinding); use a loopback address", r.Host)
	}
	return ""
}

// sameLoopbackOrigin reports whether origin is the API's own: http or
// https to the loopback host and port r reached.
func sameLoopbackOrigin(origin string, r *http.Request) bool {
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	return origin == scheme+r.Host && (httpserver.IsLoopback(r.Host) || httpserver.IsLoopback(r.Host+":0"))
}

// withScope records scope in ctx, and with the exec scope the authority to
// change what commands backends run.
func withScope(ctx context.Context, scope Scope) context.Context {
	ctx = context.WithValue(ctx, scopeKey{}, scope)
	if scope >= ScopeExec {
		ctx = controller.MayRunCommands(ctx)
	}
	return ctx
}

// scopeOf finds the scope of a request's bearer token, comparing every
// token in constant time.
func (t Tokens) scopeOf(r *http.Request) Scope {
	got, ok := httpserver.BearerToken(r)
	if !ok {
		return 0
	}
	var found Scope
	for token, scope := range t {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			found = scope
		}
	}
	return found
}
