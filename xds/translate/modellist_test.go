package translate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/ir"
)

// TestModelListRoutes: a route key's table answers GET <base>/models with
// the models of every model-routed endpoint of that base, merged; not
// where an endpoint routes that path itself, nor where the path would
// fall under another route key, nor for endpoints that route by no model.
func TestModelListRoutes(t *testing.T) {
	byModel := func(name, route string, models ...string) ir.Endpoint {
		e := ir.Endpoint{Name: name, Route: route, Models: &ir.Models{Field: "model", Models: map[string]ir.Split{}}}
		for _, m := range models {
			e.Models.Models[m] = ir.Split{Traffic: map[string]float64{"b": 1}}
		}
		return e
	}
	for _, c := range []struct {
		name    string
		members []ir.Endpoint
		want    map[string][]string // path -> models
	}{
		{"chat and completions share their base", []ir.Endpoint{byModel("chat", "/v1/chat/completions", "b", "a"), byModel("text", "/v1/completions", "c", "a")},
			map[string][]string{"/v1/models": {"a", "b", "c"}}},
		{"a route that is the base", []ir.Endpoint{byModel("llm", "/llm", "x")}, map[string][]string{"/llm/models": {"x"}}},
		{"an endpoint routes the path itself", []ir.Endpoint{byModel("chat", "/v1/chat/completions", "a"), {Name: "mine", Route: "/v1/models"}}, map[string][]string{}},
		{"the path falls under another key", []ir.Endpoint{byModel("chat", "/chat/completions", "a")}, map[string][]string{}},
		{"no model routing", []ir.Endpoint{{Name: "plain", Route: "/v1/chat/completions"}}, map[string][]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := map[string][]string{}
			for _, r := range modelListRoutes(c.members) {
				var list struct {
					Object string
					Data   []struct{ ID, Object string }
				}
				if err := json.Unmarshal([]byte(r.GetDirectResponse().GetBody().GetInlineString()), &list); err != nil || list.Object != "list" {
					t.Fatalf("%s: not an OpenAI model list (%v): %s", r.GetName(), err, r.GetDirectResponse().GetBody().GetInlineString())
				}
				if m := r.GetMatch(); len(m.GetHeaders()) != 1 || m.GetHeaders()[0].GetStringMatch().GetSafeRegex().GetRegex() != "GET" {
					t.Errorf("%s: matches %v, want GET alone", r.GetName(), m.GetHeaders())
				}
				for _, d := range list.Data {
					got[r.GetMatch().GetPath()] = append(got[r.GetMatch().GetPath()], d.ID)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("model lists %v, want %v", got, c.want)
			}
		})
	}
}

// TestALongModelListIsSent: a table whose model list is longer than
// Envoy's default bound on direct answers (4 KiB) raises the bound, or
// Envoy would refuse the table.
func TestALongModelListIsSent(t *testing.T) {
	e := ir.Endpoint{Name: "chat", Route: "/v1/chat/completions", Models: &ir.Models{Field: "model", Models: map[string]ir.Split{}}}
	for i := range 200 {
		e.Models.Models[fmt.Sprintf("model-%03d-%s", i, strings.Repeat("x", 20))] = ir.Split{Traffic: map[string]float64{"b": 1}}
	}
	routes := modelListRoutes([]ir.Endpoint{e})
	body := len(routes[0].GetDirectResponse().GetBody().GetInlineString())
	rc := publicRoutesConfig("v1", routes)
	if body <= defaultDirectBodyLimit || rc.GetMaxDirectResponseBodySizeBytes().GetValue() < uint32(body) {
		t.Fatalf("a model list of %d bytes: the table allows %d", body, rc.GetMaxDirectResponseBodySizeBytes().GetValue())
	}
	if small := publicRoutesConfig("v1", nil); small.GetMaxDirectResponseBodySizeBytes() != nil {
		t.Error("a table with no long answer sets a bound")
	}
}
