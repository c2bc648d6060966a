package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/invopop/jsonschema"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/meshspec"
	xdsserver "github.com/servemesh/servemesh/xds/server"
)

// OpenAPIPath is where the controller serves its API's OpenAPI 3.1
// description, which openapi.json in this package holds too.
const OpenAPIPath = "/v1/openapi.json"

// operation is one route of the API: its method and path, what the OpenAPI
// description says of it, and its handler. Handler serves the operations
// and OpenAPI describes them, from this one table, so the two cannot name
// different routes or methods; the tests check that every answer's status
// and body are the ones described.
type operation struct {
	method, path string
	id, summary  string
	// body is a value of the request body's type; nil: no body. yaml: an
	// application/yaml body is taken too.
	body any
	yaml bool
	// mergePatch: the body is a JSON merge patch (RFC 7386) of body's
	// type, as application/merge-patch+json or application/json.
	mergePatch bool
	// query are the query parameters.
	query []queryParam
	// ok is the status of success, and okBody a value of its body's type;
	// unchanged, for a create, is 200 with the same body: what it asks is
	// already so.
	ok        int
	okBody    any
	unchanged bool
	// errors are the other statuses it may answer, each with an ErrorBody.
	errors []int
	handle func(*server) http.HandlerFunc
	// logs: it reads agents' logs (Sources.Logs).
	logs bool
}

// Error statuses, by what may cause them.
var (
	authErrors  = []int{http.StatusUnauthorized, http.StatusForbidden}
	bodyErrors  = []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType}
	writeErrors = []int{http.StatusConflict, http.StatusServiceUnavailable, http.StatusInternalServerError}
)

func codes(groups ...[]int) []int {
	var out []int
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

// operations are the API's routes. GET /v1/status is served only by a
// controller that reports status (Handler's status argument); GET
// /v1/xds/nodes by every control plane (NodesHandler).
func operations() []operation {
	notFound := []int{http.StatusNotFound}
	read := codes(authErrors, notFound)
	write := codes(authErrors, bodyErrors, notFound, writeErrors)
	bodyless := codes(authErrors, notFound, writeErrors)
	return []operation{
		{method: "GET", path: "/v1/backends", id: "listBackends", summary: "List the backends", ok: 200, okBody: []meshspec.Backend{}, errors: authErrors,
			handle: func(s *server) http.HandlerFunc { return s.listBackends }},
		{method: "POST", path: "/v1/backends", id: "createBackend", unchanged: true, summary: "Create a backend", body: meshspec.BackendSpec{}, ok: 201, okBody: Changed{},
			errors: codes(authErrors, bodyErrors, writeErrors), handle: func(s *server) http.HandlerFunc { return s.createBackend }},
		{method: "GET", path: "/v1/backends/{name}", id: "getBackend", summary: "Read a backend", ok: 200, okBody: meshspec.Backend{}, errors: read,
			handle: func(s *server) http.HandlerFunc { return s.getBackend }},
		{method: "PATCH", path: "/v1/backends/{name}", id: "updateBackend", summary: "Change a backend's config", body: meshspec.BackendConfigPatch{}, mergePatch: true,
			ok: 200, okBody: Changed{}, errors: write, handle: func(s *server) http.HandlerFunc { return s.updateBackend }},
		{method: "DELETE", path: "/v1/backends/{name}", id: "deleteBackend", summary: "Delete a backend", ok: 200, okBody: Changed{}, errors: bodyless,
			handle: func(s *server) http.HandlerFunc { return s.deleteBackend }},
		{method: "GET", path: "/v1/endpoints", id: "listEndpoints", summary: "List the endpoints", ok: 200, okBody: []meshspec.Endpoint{}, errors: authErrors,
			handle: func(s *server) http.HandlerFunc { return s.listEndpoints }},
		{method: "POST", path: "/v1/endpoints", id: "createEndpoint", unchanged: true, summary: "Create an endpoint", body: meshspec.Endpoint{}, ok: 201, okBody: Changed{},
			errors: codes(authErrors, bodyErrors, writeErrors), handle: func(s *server) http.HandlerFunc { return s.createEndpoint }},
		{method: "GET", path: "/v1/endpoints/{name}", id: "getEndpoint", summary: "Read an endpoint", ok: 200, okBody: meshspec.Endpoint{}, errors: read,
			handle: func(s *server) http.HandlerFunc { return s.getEndpoint }},
		{method: "PATCH", path: "/v1/endpoints/{name}", id: "updateEndpoint", summary: "Change an endpoint's fields (a JSON merge patch: its route, methods, timeouts, limits, traffic; not its name or rollout)", body: meshspec.Endpoint{}, mergePatch: true,
			ok: 200, okBody: Changed{}, errors: write, handle: func(s *server) http.HandlerFunc { return s.updateEndpoint }},
		{method: "DELETE", path: "/v1/endpoints/{name}", id: "deleteEndpoint", summary: "Delete an endpoint", ok: 200, okBody: Changed{}, errors: bodyless,
			handle: func(s *server) http.HandlerFunc { return s.deleteEndpoint }},
		{method: "PUT", path: "/v1/endpoints/{name}/traffic", id: "setTraffic", summary: "Set an endpoint's traffic split", body: TrafficRequest{}, ok: 200, okBody: Changed{},
			errors: write, handle: func(s *server) http.HandlerFunc { return s.setTraffic }},
		{method: "PUT", path: "/v1/endpoints/{name}/shadows/{backend}", id: "setShadow", summary: "Set the proportion of an endpoint's requests mirrored to a backend", body: ShadowRequest{},
			ok: 200, okBody: Changed{}, errors: write, handle: func(s *server) http.HandlerFunc { return s.setShadow }},
		{method: "POST", path: "/v1/endpoints/{name}/rollout", id: "startRollout", unchanged: true, summary: "Start a rollout of a candidate backend", body: meshspec.Rollout{}, ok: 201, okBody: Changed{},
			errors: write, handle: func(s *server) http.HandlerFunc { return s.startRollout }},
		{method: "GET", path: "/v1/endpoints/{name}/rollout", id: "getRollout", summary: "Read an endpoint's rollout", ok: 200, okBody: RolloutReport{}, errors: read,
			handle: func(s *server) http.HandlerFunc { return s.getRollout }},
		{method: "POST", path: "/v1/endpoints/{name}/rollout/{action}", id: "actOnRollout", summary: "Pause, resume, promote or abort a rollout", ok: 200, okBody: Changed{},
			errors: codes(authErrors, []int{http.StatusBadRequest}, notFound, writeErrors), handle: func(s *server) http.HandlerFunc { return s.actOnRollout }},
		{method: "GET", path: NodesPath, id: "listNodes", summary: "List the nodes: registered, cordoned or drained, their replicas and release", ok: 200,
			okBody: []controller.NodeReport{}, errors: codes(authErrors, []int{http.StatusServiceUnavailable}), handle: func(s *server) http.HandlerFunc { return s.listNodes }},
		{method: "PUT", path: NodesPath + "/{name}/policy", id: "setNodePolicy", summary: "Set what the operator grants a node: the scheduler takes the smaller of it and the agent's claim (exec scope)",
			body: meshspec.NodePolicy{}, ok: 200, okBody: Changed{}, errors: codes(authErrors, bodyErrors, writeErrors), handle: func(s *server) http.HandlerFunc { return s.setNodePolicy }},
		{method: "DELETE", path: NodesPath + "/{name}/policy", id: "clearNodePolicy", summary: "Clear a node's policy: it is taken at its agent's word (exec scope)",
			ok: 200, okBody: Changed{}, errors: codes(authErrors, []int{http.StatusBadRequest}, writeErrors), handle: func(s *server) http.HandlerFunc { return s.clearNodePolicy }},
		{method: "GET", path: TracingPath, id: "getTracing", summary: "Read the mesh's tracing: its collector and sampling", ok: 200,
			okBody: meshspec.Tracing{}, errors: read, handle: func(s *server) http.HandlerFunc { return s.getTracing }},
		{method: "PUT", path: TracingPath, id: "setTracing", summary: "Trace the mesh's requests: every node's Envoy sends spans to an OTLP/gRPC collector (a new collector needs the exec scope)",
			body: meshspec.Tracing{}, ok: 200, okBody: Changed{}, errors: codes(authErrors, bodyErrors, writeErrors), handle: func(s *server) http.HandlerFunc { return s.setTracing }},
		{method: "DELETE", path: TracingPath, id: "clearTracing", summary: "Stop tracing the mesh's requests",
			ok: 200, okBody: Changed{}, errors: codes(authErrors, []int{http.StatusBadRequest}, writeErrors), handle: func(s *server) http.HandlerFunc { return s.clearTracing }},
		{method: "POST", path: NodesPath + "/{name}/{action}", id: "actOnNode", summary: "Cordon, uncordon or drain a node", ok: 200, okBody: Changed{},
			errors: codes(authErrors, []int{http.StatusBadRequest}, notFound, writeErrors), handle: func(s *server) http.HandlerFunc { return s.actOnNode }},
		{method: "GET", path: SpecPath, id: "getSpec", summary: "Read the declared state as a config file that apply takes back unchanged: the backends, endpoints and mesh settings of one revision",
			ok: 200, okBody: meshspec.Spec{}, errors: authErrors, handle: func(s *server) http.HandlerFunc { return s.getSpec }},
		{method: "POST", path: "/v1/apply", id: "apply", summary: "Make the state the one given, in one change (dry_run: only say what would change; prune_rollouts: remove the records of ended rollouts the file does not declare, which are kept otherwise; merge: keep the backends, endpoints and mesh settings the file does not name)", body: meshspec.Spec{}, yaml: true,
			query: []queryParam{flagParam("dry_run"), flagParam("prune_rollouts"), flagParam("merge")}, ok: 200, okBody: ApplyResult{}, errors: codes(authErrors, bodyErrors, writeErrors),
			handle: func(s *server) http.HandlerFunc { return s.apply }},
		{method: "GET", path: "/v1/backends/{name}/logs", id: "getBackendLogs", summary: "Read a backend's replicas' logs from their nodes' agents: the last tail lines, or, for one replica, what follows offset (exec scope)",
			query: []queryParam{logReplicaParam, logTailParam, logOffsetParam}, ok: 200, okBody: LogsReport{}, errors: codes(authErrors, []int{http.StatusBadRequest}, notFound),
			logs: true, handle: func(s *server) http.HandlerFunc { return s.backendLogs }},
		{method: "GET", path: NodesPath + "/{name}/logs", id: "getNodeLogs", summary: "Read a node's Envoy's log from its agent: the last tail lines, or what follows offset (exec scope)",
			query: []queryParam{logTailParam, logOffsetParam}, ok: 200, okBody: LogsReport{}, errors: authErrors,
			logs: true, handle: func(s *server) http.HandlerFunc { return s.nodeLogs }},
		{method: "GET", path: "/v1/leader", id: "getLeader", summary: "Say whether this controller leads, and which does", ok: 200, okBody: LeaderInfo{}, errors: authErrors,
			handle: func(s *server) http.HandlerFunc { return s.leader }},
		{method: "GET", path: ServedPath, id: "getServed", summary: "Say whether every connected node serves a change (the revision a write answered) and the named backends' replicas, all ready",
			query: []queryParam{revisionParam, namesParam("backend"), namesParam("endpoint")}, ok: 200, okBody: ServedReport{},
			errors: codes(authErrors, []int{http.StatusBadRequest}, notFound),
			handle: func(s *server) http.HandlerFunc { return s.served }},
		{method: "GET", path: "/v1/status", id: "getStatus", summary: "What is configured next to what is happening", ok: 200, okBody: StatusReport{}, errors: authErrors,
			handle: func(s *server) http.HandlerFunc { return s.status }},
		{method: "GET", path: PrometheusTargetsPath, id: "listPrometheusTargets", summary: "The live nodes' agents as Prometheus HTTP service discovery targets (http_sd_configs)",
			ok: 200, okBody: []PrometheusTargets{}, errors: codes(authErrors, []int{http.StatusServiceUnavailable}),
			handle: func(s *server) http.HandlerFunc { return s.prometheusTargets }},
		{method: "GET", path: XDSNodesPath, id: "listXDSNodes", summary: "Which configuration each Envoy node holds", ok: 200, okBody: []xdsserver.NodeStatus{}, errors: authErrors},
		{method: "GET", path: OpenAPIPath, id: "getOpenAPI", summary: "This description", ok: 200, okBody: map[string]any{}, errors: authErrors,
			handle: func(*server) http.HandlerFunc { return serveOpenAPI }},
	}
}

// successes are the statuses of op's success.
func (op operation) successes() []int {
	if op.unchanged {
		return []int{op.ok, http.StatusOK}
	}
	return []int{op.ok}
}

// PrometheusTargetsPath lists the agents' metrics listeners for
// Prometheus's http_sd_configs (deploy/prometheus).
const PrometheusTargetsPath = "/v1/prometheus/targets"

// PrometheusTargets is one group of Prometheus HTTP service discovery: an
// agent's status listener, which serves /metrics, labelled with its node.
type PrometheusTargets struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

func (s *server) prometheusTargets(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.src.Agents(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "listing the agents: "+err.Error(), "")
		return
	}
	out := []PrometheusTargets{}
	for _, n := range nodes {
		if n.StatusAddr != "" {
			out = append(out, PrometheusTargets{Targets: []string{n.StatusAddr}, Labels: map[string]string{"servemesh_node": n.ID}})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// NodesHandler answers GET /v1/xds/nodes with status.
func NodesHandler(status func() []xdsserver.NodeStatus) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, nonNil(status())) })
}

var (
	openAPIOnce sync.Once
	openAPIDoc  []byte
	openAPIErr  error
)

// OpenAPI is the API's OpenAPI 3.1 description, as JSON, built once.
func OpenAPI() ([]byte, error) {
	openAPIOnce.Do(func() { openAPIDoc, openAPIErr = buildOpenAPI() })
	return openAPIDoc, openAPIErr
}

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	doc, err := OpenAPI()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error(), "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(doc)
}

// buildOpenAPI describes operations(): each body's schema is reflected
// from its Go type (field names and omitempty from the json tags, the
// doc comments' first sentences as descriptions are left out), shared
// under components.schemas.
func buildOpenAPI() ([]byte, error) {
	schemas := newSchemaSet()
	paths := map[string]map[string]any{}
	for _, op := range operations() {
		item := paths[op.path]
		if item == nil {
			item = map[string]any{}
			paths[op.path] = item
		}
		o := map[string]any{"operationId": op.id, "summary": op.summary, "responses": responses(op, schemas)}
		if params := parameters(op); len(params) > 0 {
			o["parameters"] = params
		}
		if op.body != nil {
			content := map[string]any{"application/json": map[string]any{"schema": schemas.ref(op.body)}}
			if op.yaml {
				content["application/yaml"] = map[string]any{"schema": schemas.ref(op.body)}
			}
			body := map[string]any{"required": true, "content": content}
			if op.mergePatch {
				content["application/merge-patch+json"] = map[string]any{"schema": schemas.ref(op.body)}
				body["description"] = "A JSON merge patch (RFC 7386) of the backend's config: any field of its config (the schema lists the common ones), " +
					"null removes one, an object merges into the one it names (user_config and resources are replaced whole); replicas replaces a backend's listed replicas."
			}
			o["requestBody"] = body
		}
		item[strings.ToLower(op.method)] = o
	}
	schemas.refine()
	doc := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "servemesh controller API", "version": "v1",
			"description": "The controller's HTTP API: backends, endpoints, their traffic, shadows and rollouts, the whole state at once (apply), and status. Every request carries a bearer token (Authorization: Bearer <token>) unless the controller runs without tokens on loopback; a write needs the write scope, a command or its environment the exec scope. A follower answers writes 503 with the leader's address in X-Servemesh-Leader."},
		"paths":      paths,
		"components": map[string]any{"schemas": schemas.defs, "securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}}},
		"security":   []any{map[string]any{"bearer": []any{}}},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	// The reflected schemas refer to each other as JSON Schema's $defs;
	// here they are components.schemas.
	return bytes.ReplaceAll(buf.Bytes(), []byte(`"#/$defs/`), []byte(`"#/components/schemas/`)), schemas.err
}

// parameters are an operation's path parameters (strings) and query
// parameters.
func parameters(op operation) []any {
	var out []any
	for _, part := range strings.Split(op.path, "/") {
		if name, ok := strings.CutPrefix(part, "{"); ok {
			name = strings.TrimSuffix(name, "}")
			schema := map[string]any{"type": "string", "minLength": 1}
			if name == "action" {
				schema = map[string]any{"type": "string", "enum": rolloutActions()}
			}
			out = append(out, map[string]any{"name": name, "in": "path", "required": true, "schema": schema})
		}
	}
	for _, q := range op.query {
		p := map[string]any{"name": q.name, "in": "query", "required": false, "schema": q.schema}
		if q.schema["type"] == "array" { // ?backend=a&backend=b
			p["style"], p["explode"] = "form", true
		}
		out = append(out, p)
	}
	return out
}

// queryParam is a query parameter of an operation, and its JSON schema.
type queryParam struct {
	name   string
	schema map[string]any
}

// flagParam is a boolean query parameter (?dry_run=true).
func flagParam(name string) queryParam {
	return queryParam{name, map[string]any{"type": "boolean"}}
}

// namesParam is a query parameter that may be given more than once, each
// time a name.
func namesParam(name string) queryParam {
	return queryParam{name, map[string]any{"type": "array", "items": map[string]any{"type": "string", "minLength": 1}}}
}

// revisionParam is the revision a write answered, in decimal; none or 0:
// the current one.
var revisionParam = queryParam{"revision", map[string]any{"type": "string", "pattern": "^[0-9]{1,20}$"}}

func rolloutActions() []string {
	var out []string
	for _, a := range meshspec.RolloutActions {
		out = append(out, string(a))
	}
	return out
}

// responses are an operation's answers by status.
func responses(op operation, schemas *schemaSet) map[string]any {
	out := map[string]any{}
	for _, code := range op.successes() {
		out[strconv.Itoa(code)] = map[string]any{"description": http.StatusText(code),
			"content": map[string]any{"application/json": map[string]any{"schema": schemas.ref(op.okBody)}}}
	}
	for _, code := range op.errors {
		out[strconv.Itoa(code)] = map[string]any{"description": http.StatusText(code),
			"content": map[string]any{"application/json": map[string]any{"schema": schemas.ref(ErrorBody{})}}}
	}
	return out
}

// schemaSet reflects Go types into JSON schemas, each named type once
// under components.schemas.
type schemaSet struct {
	reflector *jsonschema.Reflector
	defs      map[string]*jsonschema.Schema
	err       error
}

func newSchemaSet() *schemaSet {
	r := &jsonschema.Reflector{
		// Fields without omitempty are required, as the decoder's
		// validation has them; unknown fields are refused, as by the
		// strict decoder.
		RequiredFromJSONSchemaTags: false,
		Namer:                      schemaName,
		Mapper:                     anyJSON,
	}
	return &schemaSet{reflector: r, defs: map[string]*jsonschema.Schema{}}
}

// ref is the schema of v's type: a reference to it under
// components.schemas, or, for a slice or map, one of its elements'.
func (s *schemaSet) ref(v any) any {
	t := reflect.TypeOf(v)
	switch t.Kind() {
	case reflect.Slice:
		return map[string]any{"type": "array", "items": s.ref(reflect.Zero(t.Elem()).Interface())}
	case reflect.Map:
		return map[string]any{"type": "object"}
	}
	schema := s.reflector.ReflectFromType(t)
	for name, def := range schema.Definitions {
		s.defs[name] = def
	}
	return map[string]any{"$ref": "#/components/schemas/" + schemaName(t)}
}

// refine adds to the reflected schemas what the Go types cannot say and
// validation checks: names' pattern, and weights and proportions in [0, 1].
// A fuzzer then makes more requests the controller takes, and so reaches
// further.
func (s *schemaSet) refine() {
	property := func(def, prop string) *jsonschema.Schema {
		if d := s.defs[def]; d != nil && d.Properties != nil {
			if p, ok := d.Properties.Get(prop); ok {
				return p
			}
		}
		return nil
	}
	for _, def := range []string{"BackendSpec", "Backend", "Endpoint"} {
		if p := property(def, "name"); p != nil {
			p.Pattern = meshspec.NamePattern
		}
	}
	unit := func(p *jsonschema.Schema) {
		if p != nil {
			p.Minimum, p.Maximum = json.Number("0"), json.Number("1")
		}
	}
	for _, at := range [][2]string{{"Endpoint", "traffic"}, {"Endpoint", "shadows"}, {"TrafficRequest", "traffic"}} {
		if p := property(at[0], at[1]); p != nil {
			unit(p.AdditionalProperties)
		}
	}
	unit(property("ShadowRequest", "proportion"))
}

// schemaName names a type's schema: its Go name, with its package's for
// the types of another package than model and api that share a name.
func schemaName(t reflect.Type) string {
	if strings.HasSuffix(t.PkgPath(), "/xds/server") {
		return "XDS" + t.Name()
	}
	return t.Name()
}

// anyJSON maps the types that hold any JSON value to the schema that
// allows any.
func anyJSON(t reflect.Type) *jsonschema.Schema {
	if t == reflect.TypeOf(json.RawMessage{}) || t == reflect.TypeOf(meshspec.UserConfig{}) {
		return &jsonschema.Schema{}
	}
	return nil
}
