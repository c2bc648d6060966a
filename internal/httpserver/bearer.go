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
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimLeft(got, " ")), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="servemesh"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
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
