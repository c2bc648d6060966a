package meshspec

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
)

// PatchEndpoint merges patch, an RFC 7386 JSON merge patch of the
// endpoint's JSON, into e: a member set to null removes the field, an
// object merges into the object it names, anything else replaces the
// value. Its name and its rollout are not a patch's to change (the
// rollout has verbs of its own). The result is decoded strictly: a field
// the endpoint does not have is refused by name. It is not validated
// here.
func PatchEndpoint(e Endpoint, patch []byte) (Endpoint, error) {
	var p map[string]any
	if err := stdjson.Unmarshal(patch, &p); err != nil {
		return e, fmt.Errorf("the patch: want a JSON object of the endpoint's fields to change, null removing one: %w", err)
	}
	if p == nil {
		return e, errors.New("the patch: want a JSON object of the endpoint's fields to change, null removing one; it is null")
	}
	if name, ok := p["name"]; ok && name != e.Name {
		return e, errors.New("name: an endpoint keeps its name; create one of the new name and delete this one")
	}
	if _, ok := p["rollout"]; ok {
		return e, errors.New("rollout: start, pause, promote or abort a rollout with servemesh rollout (POST /v1/endpoints/{name}/rollout)")
	}
	rollout := e.Rollout
	e.Rollout = nil
	current, err := stdjson.Marshal(e)
	if err != nil {
		return e, fmt.Errorf("endpoint %q: %w", e.Name, err)
	}
	var doc any
	if err := stdjson.Unmarshal(current, &doc); err != nil {
		return e, fmt.Errorf("endpoint %q: %w", e.Name, err)
	}
	merged, err := stdjson.Marshal(MergePatch(doc, p))
	if err != nil {
		return e, fmt.Errorf("the patch: %w", err)
	}
	var out Endpoint
	dec := stdjson.NewDecoder(bytes.NewReader(merged))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return e, fmt.Errorf("the patch: %w", err)
	}
	out.Name, out.Rollout = e.Name, rollout
	return out, nil
}
