package model

import (
	"bytes"
	"errors"
	"fmt"

	"sigs.k8s.io/yaml"
)

// Parse reads a model from YAML (or JSON) and validates it. Unknown,
// duplicate and differently-cased fields are errors (DecodeJSON), so a
// misspelt key is reported instead of silently ignored.
//
// An empty input is an error, not an empty model: a file caught half-written
// must not wipe the mesh. Write `{}` for a model with nothing in it.
func Parse(data []byte) (*Model, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("parse model: the input is empty; write {} for a mesh with nothing in it")
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("parse model: %w", err)
	}
	var m Model
	if err := DecodeJSON(js, &m); err != nil {
		return nil, fmt.Errorf("parse model: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Marshal renders a model as YAML, the format Parse reads.
func Marshal(m *Model) ([]byte, error) {
	out, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal model: %w", err)
	}
	return out, nil
}
