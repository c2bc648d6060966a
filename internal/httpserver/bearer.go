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
