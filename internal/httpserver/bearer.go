package httpserver

import (
	"crypto/subtle"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// RequireBearer answers 401 to a request without `Authorization: Bearer
// token` (the scheme case-insensitive, as RFC 9110 says); an empty token
// requires nothing.
func RequireBearer(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := BearerToken(r)
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="servemesh"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// BearerToken returns the token of a request's `Authorization: Bearer`
// header; the scheme matches case-insensitively (RFC 9110), the token is
// as sent.
func BearerToken(r *http.Request) (string, bool) {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(token, " "), true
}

// IsLoopback reports whether a listen address (host:port) is on loopback
// only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// NoRedirects is a CheckRedirect for http.Client that follows no redirect:
// the 3xx is the answer. servemesh's clients each talk to one address (a
// replica's probe, scrape and reconfigure, the controller reading a node's
// load, the CLI's API calls); following a redirect would send them, and the
// token or config they carry, wherever the answer names (a replica
// pointing its agent at the node's Consul, a node pointing the controller
// at an internal address).
func NoRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
