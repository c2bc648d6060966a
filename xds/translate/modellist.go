package translate

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// The model list. OpenAI's clients take a base URL (http://node/v1) and
// ask GET <base>/models which models they may name; llama.cpp's and
// vLLM's servers answer it, and a mesh that routes by model must too, or
// the answer is Envoy's 404 (or a replica's, naming its own models only).
// A model-routed endpoint's base is its route without the operation it
// serves (/v1/chat/completions -> /v1); the public table of its route key
// answers GET <base>/models with the models of every model-routed
// endpoint of that base, as OpenAI's API lists them. An endpoint whose
// route is that path keeps it, and a base whose models path falls under
// another route key (an endpoint routed at /chat/completions) gets none.

// openAIOperations are the paths OpenAI's API serves under its base.
var openAIOperations = []string{"/chat/completions", "/completions", "/embeddings", "/responses"}

// modelListPath is where e's clients ask for its models, or "" if the
// public table of e's route key cannot answer it.
func modelListPath(e ir.Endpoint) string {
	if e.Models == nil || e.Headless() {
		return ""
	}
	base := e.Route
	for _, op := range openAIOperations {
		if trimmed, ok := strings.CutSuffix(base, op); ok {
			base = trimmed
			break
		}
	}
	path := strings.TrimSuffix(base, "/") + "/models"
	if wire.PublicRouteKey(path) != wire.PublicRouteKey(e.Route) {
		return ""
	}
	return path
}

// modelListRoutes are the answers to GET <base>/models of one route key's
// endpoints (members), by path, the models of each path's endpoints
// merged; first in the key's table, as their paths are exact.
func modelListRoutes(members []ir.Endpoint) []*route.Route {
	models := map[string]map[string]bool{}
	taken := map[string]bool{}
	for _, e := range members {
		taken[e.Route] = true
		if path := modelListPath(e); path != "" {
			if models[path] == nil {
				models[path] = map[string]bool{}
			}
			for m := range e.Models.Models {
				models[path][m] = true
			}
		}
	}
	var out []*route.Route
	for _, path := range slices.Sorted(maps.Keys(models)) {
		if taken[path] {
			continue
		}
		out = append(out, &route.Route{
			Name:                 "models:" + path,
			Match:                &route.RouteMatch{PathSpecifier: &route.RouteMatch_Path{Path: path}, Headers: []*route.HeaderMatcher{methodMatcher([]string{"GET"})}},
			Action:               directAction(200, modelList(slices.Sorted(maps.Keys(models[path])))),
			ResponseHeadersToAdd: jsonAnswer(),
		})
	}
	return out
}

// modelList is OpenAI's answer listing models.
func modelList(names []string) string {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	data := make([]model, 0, len(names))
	for _, n := range names {
		data = append(data, model{ID: n, Object: "model", OwnedBy: "servemesh"})
	}
	out, err := json.Marshal(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", data})
	if err != nil {
		panic(err) // strings and integers only
	}
	return string(out) + "\n"
}
