package api

import (
	"net/http"
	"net/http/pprof"
)

// DebugHandler serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/, for finding where a controller's memory and time go
// (`go tool pprof http://<api>/debug/pprof/heap`). Only the exec scope
// gets them: a profile shows what the controller runs and holds, and
// taking one costs it. Wrap it in Tokens.Authenticate like the API.
func DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if scope := ScopeOf(r.Context()); scope < ScopeExec {
			writeError(w, http.StatusForbidden, "forbidden", "profiles need a token with the exec scope; this one has "+scope.String(), "")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// XDSCachePath is where the xDS wing's one cache is listed.
const XDSCachePath = "/debug/xds/cache"

// XDSCacheHandler serves GET /debug/xds/cache: the xDS wing's one cache
// (xds/cache), whether it is on, each kind's entries, hits and misses, and
// every entry's key (kind, name, the version of its inputs), as view
// gives them: Istio's debug view of its XdsCache. Keys name backends,
// endpoints and nodes, which any token may read; wrap it in
// Tokens.Authenticate like the API, and route GET alone to it.
func XDSCacheHandler(view func() any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, view())
	})
}
