package meshspec

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"

	"sigs.k8s.io/yaml"
)

// Parse reads what users write (a Spec) from YAML (or JSON), validates it
// and returns the model it declares. Unknown, duplicate and
// differently-cased fields are errors (DecodeJSON), so a misspelt key is
// reported instead of silently ignored, and so is a field only the system
// sets (placements, a replica's node or inbound listener).
//
// An empty input is an error, not an empty model: a file caught half-written
// must not wipe the mesh. Write `{}` for a model with nothing in it.
func Parse(data []byte) (*Model, error) {
	s, err := ParseSpec(data)
	if err != nil {
		return nil, err
	}
	return s.Model(), nil
}

// ParseSpec is Parse returning the Spec as written.
func ParseSpec(data []byte) (*Spec, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("parse model: the input is empty; write {} for a mesh with nothing in it")
	}
	sh, err := checkShape(data, reflect.TypeFor[Spec]())
	if err != nil {
		return nil, fmt.Errorf("parse model: %w", err) // YAML's own errors name the line
	}
	if err := sh.problems.err(); err != nil {
		return nil, err // every unknown field and wrong kind at once, each with its line
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("parse model: %w", err)
	}
	var s Spec
	if err := DecodeJSON(js, &s); err != nil {
		return nil, fmt.Errorf("parse model: %w", err)
	}
	for i, e := range s.Endpoints {
		if err := CheckDeclared(fmt.Sprintf("endpoints[%d] (%q)", i, e.Name), e); err != nil {
			return nil, sh.locate(err)
		}
	}
	if err := s.Model().Validate(); err != nil {
		return nil, sh.locate(err)
	}
	return &s, nil
}

// MarshalSpec renders s as a config file (YAML), which Parse reads back
// as s.
func MarshalSpec(s *Spec) ([]byte, error) {
	out, err := yaml.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("marshal spec: %w", err)
	}
	return out, nil
}

// Marshal renders a model as YAML, the format Parse reads.
func Marshal(m *Model) ([]byte, error) {
	out, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal model: %w", err)
	}
	return out, nil
}
