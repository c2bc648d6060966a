package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/rollout"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// MaxBodyBytes bounds a request body; MaxApplyBytes an apply's, which
// carries a whole model.
const (
	MaxBodyBytes  = 1 << 20
	MaxApplyBytes = 16 << 20
)

// LeaderHeader carries the leader's API address on 503 answers.
const LeaderHeader = "X-Servemesh-Leader"

// Changed is a mutation's answer.
type Changed struct {
	Changed bool `json:"changed"`
	// Revision is the stored state's revision once the call is done (the
	// change's, or a later one): what GET /v1/served waits for. Absent
	// from an older controller's answers.
	Revision uint64 `json:"revision,omitempty"`
}

// ApplyResult is the answer to /v1/apply.
type ApplyResult struct {
	// Changes are the objects created, updated or deleted, a line each
	// ("update endpoint model").
	Changes []string `json:"changes"`
	// Diff is the same with, for each update, the fields it changes.
	Diff   []controller.Change `json:"diff"`
	DryRun bool                `json:"dry_run"`
	// Revision is as in Changed.
	Revision uint64 `json:"revision,omitempty"`
}

// LeaderInfo is the answer to /v1/leader.
type LeaderInfo struct {
	Leading bool   `json:"leading"`
	Leader  string `json:"leader,omitempty"`
}

// TrafficRequest sets an endpoint's traffic.
type TrafficRequest struct {
	Traffic map[string]float64 `json:"traffic"`
	// Model, if set, names the model of an endpoint routed by model whose
	// split this is; the endpoint's own split otherwise.
	Model string `json:"model,omitempty"`
}

// ShadowRequest sets one shadow.
type ShadowRequest struct {
	Proportion *float64 `json:"proportion"`
}

// ErrorBody is every error answer.
type ErrorBody struct {
	Error  string `json:"error"`
	Kind   string `json:"kind"`
	Leader string `json:"leader,omitempty"`
}

// Sources are what a controller's API reads besides the controller; each
// may be nil, and the routes that need one are then not served.
type Sources struct {
	// Status answers GET /v1/status.
	Status func() StatusReport
	// Served answers GET /v1/served for a change of store revision rev
	// and the backends asked about (NewServedReport).
	Served func(rev uint64, backends []meshspec.Backend) ServedReport
	// Live gives the live figures of the rollouts' stages.
	Live func() map[string]rollout.Live
	// Draining gives the requests in flight to each draining replica, by
	// tag, as its agent last counted them; nil: unknown.
	Draining func() map[string]int
	// Agents lists the live nodes' agents, for GET /v1/prometheus/targets.
	Agents func(ctx context.Context) ([]wire.NodeInfo, error)
	// Logs reads a log from a node's agent, for GET /v1/backends/{name}/logs
	// and /v1/nodes/{name}/logs; nil: not served.
	Logs AgentLogs
	// Tracing receives a span per call that changes something (and per
	// read that comes with a trace context), named for its route
	// ("PUT /v1/backends/{name}"), its operation's spans under it; nil:
	// none.
	Tracing trace.TracerProvider
}

// Handler serves the /v1/ API for a controller. Wrap it (with the rest of
// the controller's HTTP paths) in Tokens.Authenticate: only a token with the
// exec scope gets the authority to change what commands run
// (controller.MayRunCommands), which the controller checks under its write
// lock.
func Handler(c *controller.Controller, log *slog.Logger, src Sources) http.Handler {
	s := &server{c: c, log: log, src: src}
	mux := http.NewServeMux()
	for _, op := range operations() {
		if op.handle == nil || (op.path == "/v1/status" && src.Status == nil) || (op.path == ServedPath && src.Served == nil) ||
			(op.path == PrometheusTargetsPath && src.Agents == nil) || (op.logs && src.Logs == nil) {
			continue // served elsewhere (NodesHandler), or not by this controller
		}
		mux.HandleFunc(op.method+" "+op.path, op.handle(s))
	}
	if src.Tracing == nil {
		return finishWrites(mux)
	}
	return finishWrites(otelhttp.NewHandler(mux, "servemesh-api", otelhttp.WithTracerProvider(src.Tracing),
		otelhttp.WithPropagators(propagation.TraceContext{}), otelhttp.WithFilter(traced)))
}

// traced reports whether a call gets a span: every one that may change
// something, and a read only when its caller traces it (the console's and
// scripts' polling would bury the rest).
func traced(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead || r.Header.Get("traceparent") != ""
}

// WriteTimeout bounds a write once its request is read: a client that hangs
// up does not cut it short, so an accepted change is made whole or not at
// all (the store's commit is atomic).
const WriteTimeout = 2 * time.Minute

// finishWrites gives every request but a read a context its client cannot
// cancel by hanging up.
func finishWrites(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), WriteTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

type server struct {
	c   *controller.Controller
	log *slog.Logger
	src Sources
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	report := s.src.Status()
	if ScopeOf(r.Context()) < ScopeExec {
		redactLogTails(&report)
	}
	writeJSON(w, http.StatusOK, report)
}

// redactLogTails cuts the log lines from the replicas' notes in report: a
// replica's log may print its environment, which only the exec scope
// reads.
func redactLogTails(report *StatusReport) {
	for i := range report.Backends {
		for j := range report.Backends[i].Replicas {
			r := &report.Backends[i].Replicas[j]
			if before, _, cut := strings.Cut(r.Note, wire.LogTailNote); cut {
				r.Note = before + wire.LogTailNote + Redacted
			}
		}
	}
}

func (s *server) listBackends(w http.ResponseWriter, r *http.Request) {
	m, _ := s.c.State()
	for i := range m.Backends {
		m.Backends[i] = redact(r.Context(), m.Backends[i])
	}
	writeJSON(w, http.StatusOK, nonNil(m.Backends))
}

// Redacted replaces the values of a process's environment for callers
// without the exec scope: they often hold the model server's secrets, and
// only who may set them may read them.
const Redacted = meshspec.RedactedEnv

// redact returns b as a caller of ctx's scope may read it. b is a copy
// (controller.State clones), so it is changed in place.
func redact(ctx context.Context, b meshspec.Backend) meshspec.Backend {
	if ScopeOf(ctx) >= ScopeExec || b.Process == nil {
		return b
	}
	for k := range b.Process.Env {
		b.Process.Env[k] = Redacted
	}
	return b
}

func (s *server) listEndpoints(w http.ResponseWriter, _ *http.Request) {
	m, _ := s.c.State()
	writeJSON(w, http.StatusOK, nonNil(m.Endpoints))
}

func (s *server) getBackend(w http.ResponseWriter, r *http.Request) {
	b, err := s.c.GetBackend(r.PathValue("name"))
	s.answer(w, redact(r.Context(), b), err)
}

func (s *server) getEndpoint(w http.ResponseWriter, r *http.Request) {
	e, err := s.c.GetEndpoint(r.PathValue("name"))
	s.answer(w, e, err)
}

func (s *server) createBackend(w http.ResponseWriter, r *http.Request) {
	var b meshspec.BackendSpec
	if !decode(w, r, &b) {
		return
	}
	changed, err := s.c.CreateBackend(r.Context(), b)
	s.answerChange(w, changed, err, http.StatusCreated)
}

// updateBackend takes a JSON merge patch of the backend's config (as
// application/merge-patch+json or application/json: the previous release's
// bodies are merge patches too, their removal conventions read as null).
func (s *server) updateBackend(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, MaxBodyBytes, mediaJSON, mediaMergePatch)
	if !ok {
		return
	}
	p, err := meshspec.ParseConfigPatch(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error(), "")
		return
	}
	changed, err := s.c.PatchBackendConfig(r.Context(), r.PathValue("name"), p)
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) deleteBackend(w http.ResponseWriter, r *http.Request) {
	changed, err := s.c.DeleteBackend(r.Context(), r.PathValue("name"))
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) createEndpoint(w http.ResponseWriter, r *http.Request) {
	var e meshspec.Endpoint
	if !decode(w, r, &e) {
		return
	}
	changed, err := s.c.CreateEndpoint(r.Context(), e)
	s.answerChange(w, changed, err, http.StatusCreated)
}

func (s *server) updateEndpoint(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, MaxBodyBytes, mediaJSON, mediaMergePatch)
	if !ok {
		return
	}
	changed, err := s.c.PatchEndpoint(r.Context(), r.PathValue("name"), body)
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	changed, err := s.c.DeleteEndpoint(r.Context(), r.PathValue("name"))
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) setTraffic(w http.ResponseWriter, r *http.Request) {
	var req TrafficRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Traffic == nil {
		writeError(w, http.StatusBadRequest, "invalid", `the body needs "traffic": {"<backend>": <weight>, ...}`, "")
		return
	}
	var changed bool
	var err error
	if req.Model != "" {
		changed, err = s.c.SetModelTraffic(r.Context(), r.PathValue("name"), req.Model, req.Traffic)
	} else {
		changed, err = s.c.SetTraffic(r.Context(), r.PathValue("name"), req.Traffic)
	}
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) setShadow(w http.ResponseWriter, r *http.Request) {
	var req ShadowRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Proportion == nil {
		writeError(w, http.StatusBadRequest, "invalid", `the body needs "proportion": a number in [0, 1] (0 removes the shadow)`, "")
		return
	}
	changed, err := s.c.SetShadow(r.Context(), r.PathValue("name"), r.PathValue("backend"), *req.Proportion)
	s.answerChange(w, changed, err, http.StatusOK)
}

func (s *server) apply(w http.ResponseWriter, r *http.Request) {
	var opts controller.ApplyOptions
	for _, p := range []struct {
		name string
		to   *bool
	}{{"dry_run", &opts.DryRun}, {"prune_rollouts", &opts.PruneRollouts}, {"merge", &opts.Merge}} {
		if v := r.URL.Query().Get(p.name); v != "" {
			var err error
			if *p.to, err = strconv.ParseBool(v); err != nil { // ?dry_run=yes must not apply
				writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("%s %q: not true or false; nothing was applied", p.name, v), "")
				return
			}
		}
	}
	var m meshspec.Spec
	if !decodeLimit(w, r, &m, MaxApplyBytes, true) {
		return
	}
	diff, err := s.c.Apply(r.Context(), &m, opts)
	res := ApplyResult{Changes: []string{}, Diff: nonNil(diff), DryRun: opts.DryRun, Revision: uint64(s.c.Revision())}
	for _, ch := range diff {
		res.Changes = append(res.Changes, ch.String())
	}
	s.answer(w, res, err)
}

func (s *server) leader(w http.ResponseWriter, _ *http.Request) {
	leading, leader := s.c.Leader()
	writeJSON(w, http.StatusOK, LeaderInfo{Leading: leading, Leader: leader})
}

func (s *server) answerChange(w http.ResponseWriter, changed bool, err error, createdStatus int) {
	if err == nil && changed {
		writeJSON(w, createdStatus, Changed{Changed: true, Revision: uint64(s.c.Revision())})
		return
	}
	s.answer(w, Changed{Changed: changed, Revision: uint64(s.c.Revision())}, err)
}

func (s *server) answer(w http.ResponseWriter, body any, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, body)
		return
	}
	var ce *controller.Error
	if !errors.As(err, &ce) {
		s.log.Error("unclassified API error", "err", err)
		writeError(w, http.StatusInternalServerError, "internal", err.Error(), "")
		return
	}
	status, kind := http.StatusInternalServerError, "internal"
	switch ce.Kind {
	case controller.Invalid:
		status, kind = http.StatusBadRequest, "invalid"
	case controller.NotFound:
		status, kind = http.StatusNotFound, "not_found"
	case controller.Conflict:
		status, kind = http.StatusConflict, "conflict"
	case controller.NotLeader:
		status, kind = http.StatusServiceUnavailable, "not_leader"
		if ce.Leader != "" {
			w.Header().Set(LeaderHeader, ce.Leader)
		}
	case controller.Unavailable:
		status, kind = http.StatusServiceUnavailable, "unavailable"
	case controller.Forbidden:
		status, kind = http.StatusForbidden, "forbidden"
	}
	writeError(w, status, kind, err.Error(), ce.Leader)
}

// decode reads a JSON body strictly: Content-Type application/json,
// bounded size, no unknown fields, one value. On failure it answers and
// returns false.
func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	return decodeLimit(w, r, into, MaxBodyBytes, false)
}

// decodeLimit is decode with a body of at most limit bytes, in YAML too
// (application/yaml) if yamlToo.
func decodeLimit(w http.ResponseWriter, r *http.Request, into any, limit int64, yamlToo bool) bool {
	types := []string{mediaJSON}
	if yamlToo {
		types = append(types, mediaYAML, mediaXYAML)
	}
	body, ok := readBody(w, r, limit, types...)
	if !ok {
		return false
	}
	if media, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); media != mediaJSON {
		var err error
		if body, err = yaml.YAMLToJSONStrict(body); err != nil {
			writeError(w, http.StatusBadRequest, "invalid", "the YAML body: "+err.Error(), "")
			return false
		}
	}
	if err := meshspec.DecodeJSON(body, into); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error(), "")
		return false
	}
	return true
}

// The bodies' media types.
const (
	mediaJSON       = "application/json"
	mediaMergePatch = "application/merge-patch+json"
	mediaYAML       = "application/yaml"
	mediaXYAML      = "application/x-yaml"
)

// readBody reads a body of one of the media types, of at most limit
// bytes, answering the error itself when it cannot.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, types ...string) ([]byte, bool) {
	if media, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || !slices.Contains(types, media) {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
			fmt.Sprintf("the body's Content-Type is %q; send %s", r.Header.Get("Content-Type"), strings.Join(types, " or ")), "")
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is over %d bytes, the limit; split the change", limit), "")
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "invalid", "reading the body failed: "+err.Error(), "")
		return nil, false
	case len(bytes.TrimSpace(body)) == 0:
		writeError(w, http.StatusBadRequest, "invalid", "the body is empty; send a JSON object", "")
		return nil, false
	}
	return body, true
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, status int, kind, msg, leader string) {
	writeJSON(w, status, ErrorBody{Error: msg, Kind: kind, Leader: leader})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
