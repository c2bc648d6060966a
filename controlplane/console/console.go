// Package console is the controller's web console: a page and a small
// script, embedded, that draw GET /v1/status (endpoints with their split
// as bars and each backend's live request and error rates, shadows,
// rollouts, replicas per node with their health, which nodes run the latest
// config) and refresh it every second without reloading. It owns no state
// and reads nothing but the API: the page is static and served without a
// token; the script calls /v1/ with the token a person enters once per
// browser session (kept in sessionStorage), so what it may read and change
// is that token's scope. Changing a split is its one action. In the flow
// of docs/architecture.md it is a client of step 1.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// Path is where the console is served.
const Path = "/ui/" // api.ConsolePath, which needs no token

//go:embed static
var static embed.FS

// Handler serves the console's files under Path. The page runs only its
// own script (a content security policy forbids inline and foreign code)
// and may not be framed.
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded folder is there by construction
	}
	fileServer := http.StripPrefix(Path, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the console's files are read only", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		fileServer.ServeHTTP(w, r)
	})
}
