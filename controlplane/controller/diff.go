package controller

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/meshspec"
)

// Change is one object an apply creates, updates or deletes and, for an
// update, the fields it changes, as users write them (placements and
// health are not fields of theirs).
type Change struct {
	Action string        `json:"action"` // create, update or delete
	Kind   string        `json:"kind"`   // backend, endpoint or mesh (its settings)
	Name   string        `json:"name"`
	Fields []FieldChange `json:"fields,omitempty"`
}

// String is the change in one line: "update endpoint model".
func (c Change) String() string { return c.Action + " " + c.Kind + " " + c.Name }

// FieldChange is one field an update changes, by its path in the config
// file ("traffic.model-v1"), with its JSON value before and after (absent
// when it was or will be unset).
type FieldChange struct {
	Field string          `json:"field"`
	From  json.RawMessage `json:"from,omitempty"`
	To    json.RawMessage `json:"to,omitempty"`
}

// String is the field change in one line: "traffic.model-v1: 0.7 -> 0.9";
// a long list is summed up by its length ("[4 items]").
func (f FieldChange) String() string {
	show := func(v json.RawMessage) string {
		switch {
		case v == nil:
			return "(none)"
		case len(v) > maxShownValue && v[0] == '[':
			var items []json.RawMessage
			if json.Unmarshal(v, &items) == nil {
				return fmt.Sprintf("[%d items]", len(items))
			}
		}
		return string(v)
	}
	return fmt.Sprintf("%s: %s -> %s", f.Field, show(f.From), show(f.To))
}

// maxShownValue is the longest value a field change's line shows whole.
const maxShownValue = 80

// order is where a change comes among an apply's, as they happen: what
// others name is made first and removed last (a backend before the
// endpoints that send to it, which are deleted before it).
func (c Change) order() int {
	deleted := c.Action == "delete"
	switch {
	case c.Kind == "mesh" && !deleted:
		return 0
	case c.Kind == "backend" && !deleted:
		return 1
	case c.Kind == "endpoint" && !deleted:
		return 2
	case c.Kind == "endpoint":
		return 3
	case c.Kind == "backend":
		return 4
	}
	return 5
}

// describe lists what ch changes in current, sorted by object.
func describe(current *meshspec.Model, ch store.Change) []Change {
	var out []Change
	backends := indexByName(current.Backends, func(b meshspec.Backend) string { return b.Name })
	endpoints := indexByName(current.Endpoints, func(e meshspec.Endpoint) string { return e.Name })
	for _, b := range ch.PutBackends {
		c := Change{Action: "create", Kind: "backend", Name: b.Name}
		if i, ok := backends[b.Name]; ok {
			c.Action, c.Fields = "update", fieldChanges(meshspec.BackendSpecOf(current.Backends[i]), meshspec.BackendSpecOf(b))
		}
		out = append(out, c)
	}
	for _, n := range ch.DeleteBackends {
		if _, live := backends[n]; live {
			out = append(out, Change{Action: "delete", Kind: "backend", Name: n})
		}
	}
	for _, b := range ch.PutRetiring {
		if _, live := backends[b.Name]; live { // deleted: its replicas finish their requests
			out = append(out, Change{Action: "delete", Kind: "backend", Name: b.Name})
		}
	}
	for _, e := range ch.PutEndpoints {
		c := Change{Action: "create", Kind: "endpoint", Name: e.Name}
		if i, ok := endpoints[e.Name]; ok {
			c.Action, c.Fields = "update", fieldChanges(current.Endpoints[i], e)
		}
		out = append(out, c)
	}
	for _, n := range ch.DeleteEndpoints {
		out = append(out, Change{Action: "delete", Kind: "endpoint", Name: n})
	}
	switch {
	case ch.PutMesh != nil && current.Mesh == nil:
		out = append(out, Change{Action: "create", Kind: "mesh", Name: "settings"})
	case ch.PutMesh != nil:
		out = append(out, Change{Action: "update", Kind: "mesh", Name: "settings", Fields: fieldChanges(current.Mesh, ch.PutMesh)})
	case ch.DeleteMesh:
		out = append(out, Change{Action: "delete", Kind: "mesh", Name: "settings"})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if a, b := out[i].order(), out[j].order(); a != b {
			return a < b
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// fieldChanges compares two objects as their JSON: maps field by field,
// anything else (lists included) as a whole.
func fieldChanges(before, after any) []FieldChange {
	var out []FieldChange
	diffJSON("", toJSON(before), toJSON(after), &out)
	return out
}

func toJSON(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// diffJSON lists what differs between before and after, field by field
// where both are objects or one is an object and the other absent (an
// object added or removed is its fields added or removed).
func diffJSON(path string, before, after any, out *[]FieldChange) {
	bm, bok := before.(map[string]any)
	am, aok := after.(map[string]any)
	if bok && after == nil {
		am, aok = map[string]any{}, true
	}
	if aok && before == nil {
		bm, bok = map[string]any{}, true
	}
	if bok && aok {
		keys := map[string]bool{}
		for k := range bm {
			keys[k] = true
		}
		for k := range am {
			keys[k] = true
		}
		for _, k := range meshspec.SortedKeys(keys) {
			diffJSON(strings.TrimPrefix(path+"."+k, "."), bm[k], am[k], out)
		}
		return
	}
	from, to := raw(before), raw(after)
	if string(from) != string(to) {
		*out = append(*out, FieldChange{Field: path, From: from, To: to})
	}
}

func raw(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, _ := json.Marshal(v)
	return b
}
