package meshspec

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// position is where a field is written in a file: 1-based line and column.
type position struct{ line, column int }

func (p position) String() string { return fmt.Sprintf("line %d, column %d", p.line, p.column) }

// shape is what checkShape learns of a document: what the strict decoder
// would refuse (all of it, not the first), and where each field is
// written, by the path validation names it with.
type shape struct {
	problems problems
	where    map[string]position
}

// checkShape walks a YAML (or JSON) document against the Go type users
// write (Spec) and reports, each with its line and column: unknown fields
// (with the closest known name), fields that are servemesh's to set, fields
// given twice, and values of the wrong kind. Paths read as validation's do:
// backend "a".config.num_replicas.
func checkShape(data []byte, t reflect.Type) (*shape, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	s := &shape{where: map[string]position{}}
	if len(doc.Content) > 0 {
		s.walk(doc.Content[0], t, "")
	}
	return s, nil
}

func (s *shape) walk(n *yaml.Node, t reflect.Type, path string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if path != "" {
		s.where[path] = position{n.Line, n.Column}
	}
	if n.Tag == "!!null" {
		return // unset
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[UserConfig]() {
		return // any value
	}
	switch t.Kind() {
	case reflect.Struct:
		s.walkStruct(n, t, path)
	case reflect.Map:
		if s.want(n, yaml.MappingNode, path, "a mapping (key: value)") {
			for i := 0; i+1 < len(n.Content); i += 2 {
				s.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
			}
		}
	case reflect.Slice:
		if s.want(n, yaml.SequenceNode, path, "a list") {
			seen := map[string]bool{}
			for i, item := range n.Content {
				s.walk(item, t.Elem(), itemPath(path, i, item, seen))
			}
		}
	default:
		s.scalar(n, t, path)
	}
}

func (s *shape) walkStruct(n *yaml.Node, t reflect.Type, path string) {
	if !s.want(n, yaml.MappingNode, path, "a mapping (field: value)") {
		return
	}
	fields := jsonFields(t)
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		at := position{key.Line, key.Column}
		field := join(path, key.Value)
		if seen[key.Value] {
			s.report(field, at, "is given twice; give it once")
			continue
		}
		seen[key.Value] = true
		ft, ok := fields[key.Value]
		if !ok {
			s.report(field, at, "%s", unknownField(key.Value, fields))
			continue
		}
		s.walk(value, ft, field)
	}
}

// unknownField says what is wrong with an unknown field name.
func unknownField(name string, fields map[string]reflect.Type) string {
	if why, ok := systemFields[name]; ok {
		return fmt.Sprintf("is servemesh's to set, not yours: %s; leave it out", why)
	}
	known := make([]string, 0, len(fields))
	for f := range fields {
		known = append(known, f)
	}
	slices.Sort(known)
	if best := closest(name, known); best != "" {
		return fmt.Sprintf("is not a field here; did you mean %q?", best)
	}
	return fmt.Sprintf("is not a field here; the fields here are %s", strings.Join(known, ", "))
}

// report adds a problem of field, written at at.
func (s *shape) report(field string, at position, format string, args ...any) {
	s.problems.add(fmt.Sprintf("%s (%s)", orWhole(field), at), format, args...)
}

// want reports whether n is of kind; if not, it adds a problem saying what
// path must be.
func (s *shape) want(n *yaml.Node, kind yaml.Kind, path, what string) bool {
	if n.Kind == kind {
		return true
	}
	s.report(path, position{n.Line, n.Column}, "must be %s, not %s", what, describeNode(n))
	return false
}

// scalar checks a value for a string, number or boolean field, as the JSON
// a YAML file turns into would be read.
func (s *shape) scalar(n *yaml.Node, t reflect.Type, path string) {
	at := position{n.Line, n.Column}
	if n.Kind != yaml.ScalarNode {
		s.report(path, at, "must be %s, not %s", kindName(t), describeNode(n))
		return
	}
	var ok bool
	switch t.Kind() {
	case reflect.String:
		ok = n.Tag == "!!str"
	case reflect.Bool:
		ok = n.Tag == "!!bool"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint32, reflect.Uint64:
		ok = n.Tag == "!!int"
	case reflect.Float64, reflect.Float32:
		ok = n.Tag == "!!int" || n.Tag == "!!float"
	default:
		ok = true // no such field in Spec; the decoder has the last word
	}
	if !ok {
		fix := ""
		if t.Kind() == reflect.String {
			fix = fmt.Sprintf("; quote it: %q", n.Value)
		}
		s.report(path, at, "must be %s, not %s%s", kindName(t), describeNode(n), fix)
	}
}

// jsonFields maps a struct's JSON member names to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// itemPath is the path of a list's i-th item n: for the file's backends
// and endpoints, as validation names them (ItemField); for other lists,
// by place.
func itemPath(list string, i int, n *yaml.Node, seen map[string]bool) string {
	if list != "backends" && list != "endpoints" {
		return fmt.Sprintf("%s[%d]", list, i)
	}
	name := nameOf(n)
	path := ItemField(list, i, name, seen[name])
	seen[name] = true
	return path
}

// nameOf is the name a mapping gives itself, if it gives one.
func nameOf(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "name" && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orWhole(path string) string {
	if path == "" {
		return "(the whole file)"
	}
	return path
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!str":
		return fmt.Sprintf("the text %q", n.Value)
	case "!!int", "!!float":
		return "the number " + n.Value
	case "!!bool":
		return "the boolean " + n.Value
	}
	return fmt.Sprintf("%q", n.Value)
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return "an integer"
}

// closest returns the known name nearest to name if it is near enough to
// be a misspelling (at most two edits, or a third of its letters), or "".
func closest(name string, known []string) string {
	best, bestD := "", max(2, len(name)/3)+1
	for _, k := range known {
		if d := editDistance(strings.ToLower(name), k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// locate adds to each problem of a validation error the position of its
// field in the file (or of the nearest enclosing one written there).
func (s *shape) locate(err error) error {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	out := &ValidationError{Problems: make([]string, 0, len(ve.Problems))}
	for _, p := range ve.Problems {
		field, msg, ok := strings.Cut(p, ": ")
		if at, found := s.position(field); ok && found {
			p = fmt.Sprintf("%s (%s): %s", field, at, msg)
		}
		out.Problems = append(out.Problems, p)
	}
	return out
}

// position is where field, or the nearest field enclosing it, is written.
func (s *shape) position(field string) (position, bool) {
	for f := field; f != ""; {
		if at, ok := s.where[f]; ok {
			return at, true
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	return position{}, false
}
