package meshspec

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"

	"github.com/go-json-experiment/json"
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
		return nil, errors.New("the file is empty; write {} for a mesh with nothing in it")
	}
	sh, err := checkShape(data, reflect.TypeFor[Spec]())
	if err != nil {
		return nil, syntaxError(data, err)
	}
	if len(sh.problems.list) > 0 {
		// Every unknown field and wrong kind at once, each with its line,
		// and with them what validation finds in the rest of the file, if
		// it can be read without them: every problem in one answer.
		if s, ok := lenientSpec(data); ok {
			sh.problems.merge(sh.locate(s.check()))
		}
		return nil, sh.problems.err()
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var s Spec
	if err := DecodeJSON(js, &s); err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if err := s.check(); err != nil {
		return nil, sh.locate(err)
	}
	return &s, nil
}

// check is every problem of what users wrote: fields only servemesh sets,
// and the model's validation.
func (s *Spec) check() error {
	var p problems
	for i, e := range s.Endpoints {
		p.merge(CheckDeclared(ItemField("endpoints", i, e.Name, false), e))
	}
	p.merge(s.Model().Validate())
	return p.err()
}

// lenientSpec reads what it can of a file whose shape has problems:
// unknown fields left out; a value of the wrong kind, or a file that is not
// YAML, is not read (ok false).
func lenientSpec(data []byte) (*Spec, bool) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, false
	}
	var s Spec
	if json.Unmarshal(js, &s) != nil {
		return nil, false
	}
	return &s, true
}

// MarshalSpec renders s as a config file (YAML), which Parse reads back
// as s.
func MarshalSpec(s *Spec) ([]byte, error) {
	out, err := renderYAML(s)
	if err != nil {
		return nil, fmt.Errorf("marshal spec: %w", err)
	}
	return out, nil
}

// Marshal renders a model as YAML, the format Parse reads.
func Marshal(m *Model) ([]byte, error) {
	out, err := renderYAML(m)
	if err != nil {
		return nil, fmt.Errorf("marshal model: %w", err)
	}
	return out, nil
}
