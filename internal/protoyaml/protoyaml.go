package protoyaml

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Marshal renders one message as YAML with sorted keys. protojson's output is
// deliberately unstable in its whitespace; going through YAML removes that.
func Marshal(m proto.Message) ([]byte, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %s to JSON: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	out, err := yaml.JSONToYAML(js)
	if err != nil {
		return nil, fmt.Errorf("convert %s to YAML: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return out, nil
}

// MarshalList renders messages as one YAML list, in the order given.
func MarshalList[M proto.Message](msgs []M) ([]byte, error) {
	items := make([]json.RawMessage, 0, len(msgs))
	for _, m := range msgs {
		js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("marshal %s to JSON: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
		items = append(items, js)
	}
	js, err := json.Marshal(items)
	if err != nil {
		return nil, fmt.Errorf("marshal list: %w", err)
	}
	out, err := yaml.JSONToYAML(js)
	if err != nil {
		return nil, fmt.Errorf("convert list to YAML: %w", err)
	}
	return out, nil
}

// Unmarshal reads YAML into a message, rejecting unknown fields.
func Unmarshal(data []byte, m proto.Message) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("convert YAML to JSON: %w", err)
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		return fmt.Errorf("unmarshal %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}
