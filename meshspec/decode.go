package meshspec

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// systemFields are fields of the stored state that users may not write
// (they are not in Spec), and why.
var systemFields = map[string]string{
	"placements": "the controller places a backend's replicas",
	"node":       "a replica's node comes from Consul's catalog, registered by the node's agent",
	"inbound":    "a replica's inbound listener comes from Consul's catalog, registered by the node's agent",
}

// DecodeJSON reads one JSON value into v strictly: member names must match
// the fields' names exactly (case included), unknown and duplicate members
// are errors, and nothing may follow the value. The error names the field
// by its JSON path.
func DecodeJSON(data []byte, v any) error {
	err := json.Unmarshal(data, v, json.RejectUnknownMembers(true))
	if err == nil {
		return nil
	}
	var semantic *json.SemanticError
	var syntactic *jsontext.SyntacticError
	switch {
	case errors.As(err, &syntactic):
		return fmt.Errorf("malformed JSON at byte %d: %s", syntactic.ByteOffset, strings.TrimPrefix(syntactic.Err.Error(), "jsontext: "))
	case errors.As(err, &semantic) && errors.Is(err, json.ErrUnknownName):
		ptr := string(semantic.JSONPointer)
		if why, ok := systemFields[ptr[strings.LastIndex(ptr, "/")+1:]]; ok {
			return fmt.Errorf("field %q is servemesh's to set, not yours: %s; leave it out", ptr, why)
		}
		return &UnknownFieldError{Pointer: ptr}
	case errors.As(err, &semantic) && semantic.GoType != nil:
		return fmt.Errorf("field %q must be %s, not JSON %s", fieldOf(semantic.JSONPointer), goTypeName(semantic.GoType.String()), semantic.JSONKind)
	}
	return fmt.Errorf("bad JSON: %w", err)
}

// UnknownFieldError is DecodeJSON's error for a member no field has.
type UnknownFieldError struct {
	Pointer string // the member, as a JSON pointer ("/config/num_replica")
}

func (e *UnknownFieldError) Error() string {
	return fmt.Sprintf("unknown field %q; check its spelling (names are lower case, as documented)", e.Pointer)
}

// fieldOf turns a JSON pointer ("/config/num_replicas") into a field path
// ("config.num_replicas").
func fieldOf(p jsontext.Pointer) string {
	s := strings.TrimPrefix(string(p), "/")
	if s == "" {
		return "(the whole value)"
	}
	return strings.ReplaceAll(s, "/", ".")
}

func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "map["):
		return "an object"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	}
	return "an object"
}
