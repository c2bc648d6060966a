package meshspec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	yaml "go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"
)

// renderYAML writes v as a config file is written: its fields in the
// order its type declares them (name first, as the README writes them;
// map keys sorted), nothing for what is unset (no "traffic: null"), block
// style. The field names are v's JSON names, which Parse reads.
func renderYAML(v any) ([]byte, error) {
	js, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(js, &doc); err != nil { // JSON is YAML: its order is kept
		return nil, fmt.Errorf("read back as YAML: %w", err)
	}
	plain(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// plain drops a mapping's unset values (null, or an empty mapping or list,
// which read as unset) and gives every node the block, unquoted style,
// which the encoder quotes where a value needs it (a string that would
// read as a number, say).
func plain(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && !readsAsItself(n.Value) {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		plain(c)
	}
	if n.Kind != yaml.MappingNode {
		return
	}
	kept := n.Content[:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		if !unset(n.Content[i+1]) {
			kept = append(kept, n.Content[i], n.Content[i+1])
		}
	}
	n.Content = kept
}

func unset(v *yaml.Node) bool {
	switch v.Kind {
	case yaml.ScalarNode:
		return v.Tag == "!!null"
	case yaml.MappingNode, yaml.SequenceNode:
		return len(v.Content) == 0
	}
	return false
}

// ambiguous are the plain scalars that may read as something other than
// a string: YAML 1.1's booleans (N, yes, off), numbers (0777, 1_000,
// 1:20) and dates; the encoder quotes by YAML 1.2's rules alone.
var ambiguous = regexp.MustCompile(`^[A-Za-z0-9._:+~-]{1,40}$`)

// readsAsItself reports whether s, written plain, reads back as the
// string s through the reader config files go through (Parse's, YAML 1.1).
func readsAsItself(s string) bool {
	if !ambiguous.MatchString(s) {
		return true
	}
	var v any
	if err := sigsyaml.Unmarshal([]byte(s), &v); err != nil {
		return false
	}
	got, ok := v.(string)
	return ok && got == s
}
