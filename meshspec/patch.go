package meshspec

import (
	stdjson "encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// ConfigPatch is a change to a backend's config: an RFC 7386 JSON merge
// patch of the config's JSON. A member set to null removes the field, an
// object merges into the object it names, anything else replaces the
// value; the atomic fields (atomicFields: user_config, resources) are
// replaced whole, as Kubernetes marks atomic maps; "replicas" (an array)
// replaces the replicas of a backend of listed replicas. Every config field is patched this way, so a new field
// needs nothing here. Make one with ParseConfigPatch, or from Go with a
// BackendConfigPatch's MergePatch.
type ConfigPatch struct {
	merge    map[string]any
	replicas []ReplicaSpec
}

// The previous release's removal conventions, still read: an empty
// autoscaling config ({"max_replicas": 0}, never valid), load_aware
// {"off": true} and resources {} each remove the field, as null does (and
// load_aware's "off": false is dropped).
var legacyRemovals = map[string]func(v any) bool{
	"autoscaling": zeroObject,
	"load_aware": func(v any) bool {
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		off, _ := m["off"].(bool)
		delete(m, "off") // {"off": false, ...} turned it on with the rest
		return off
	},
	"resources": func(v any) bool { m, ok := v.(map[string]any); return ok && len(m) == 0 },
}

// zeroObject reports whether v is a JSON object whose members are all zero
// (0, false, "" or null).
func zeroObject(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	for _, x := range m {
		switch x {
		case nil, float64(0), false, "":
		default:
			return false
		}
	}
	return true
}

// atomicFields are the config fields a patch replaces whole rather than
// merges into: a replica's user_config is the user's own document (Ray
// Serve replaces it on update, and a member a patch leaves in place could
// keep a replica refusing it), and resources is the whole set one replica
// needs.
var atomicFields = map[string]bool{"user_config": true, "resources": true}

// configFields are the JSON names of BackendConfig's fields.
var configFields = func() map[string]bool {
	out := map[string]bool{}
	typ := reflect.TypeFor[BackendConfig]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		out[name] = true
	}
	return out
}()

// ParseConfigPatch reads a merge patch of a backend's config. It refuses a
// body that is not a JSON object, names no field, or names a field a
// backend's config does not have.
func ParseConfigPatch(body []byte) (ConfigPatch, error) {
	var doc map[string]any
	if err := DecodeJSON(body, &doc); err != nil {
		return ConfigPatch{}, err
	}
	if doc == nil {
		return ConfigPatch{}, errors.New("the patch is null; send a JSON object of the config fields to change, such as {\"num_replicas\": 3}")
	}
	var p ConfigPatch
	if raw, ok := doc["replicas"]; ok {
		if raw == nil {
			return ConfigPatch{}, errors.New(`field "replicas": a backend of listed replicas keeps at least one; list the replicas it should have`)
		}
		b, _ := stdjson.Marshal(raw)
		if err := DecodeJSON(b, &p.replicas); err != nil {
			return ConfigPatch{}, fmt.Errorf("field \"replicas\": %w", err)
		}
		if p.replicas == nil {
			p.replicas = []ReplicaSpec{}
		}
		delete(doc, "replicas")
	}
	for name, v := range doc {
		if !configFields[name] {
			return ConfigPatch{}, &UnknownFieldError{Pointer: "/" + name}
		}
		if removed, ok := legacyRemovals[name]; ok && removed(v) {
			doc[name] = nil
		}
	}
	p.merge = doc
	if p.Empty() {
		return ConfigPatch{}, errors.New("the patch sets no field; set at least one, such as {\"num_replicas\": 3}, or null to remove one")
	}
	// A field the config lacks is refused now, naming it, not at Apply.
	if _, err := p.Apply(BackendConfig{}); err != nil {
		var unknown *UnknownFieldError
		if errors.As(err, &unknown) {
			return ConfigPatch{}, err
		}
	}
	return p, nil
}

// Empty reports whether the patch changes nothing.
func (p ConfigPatch) Empty() bool { return len(p.merge) == 0 && p.replicas == nil }

// Sets reports whether the patch names field (a config member, or
// "replicas"), to a value or to null.
func (p ConfigPatch) Sets(field string) bool {
	if field == "replicas" {
		return p.replicas != nil
	}
	_, ok := p.merge[field]
	return ok
}

// JSON is the patch as the API takes it: its merge patch, with the
// replicas it lists.
func (p ConfigPatch) JSON() (map[string]any, error) {
	out := make(map[string]any, len(p.merge)+1)
	for k, v := range p.merge {
		out[k] = v
	}
	if p.replicas != nil {
		b, err := stdjson.Marshal(p.replicas)
		if err != nil {
			return nil, fmt.Errorf("patch replicas: %w", err)
		}
		var r any
		if err := stdjson.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("patch replicas: %w", err)
		}
		out["replicas"] = r
	}
	return out, nil
}

// Replicas are the replicas the patch lists, or nil.
func (p ConfigPatch) Replicas() []ReplicaSpec { return p.replicas }

// Fields are the config members the patch names, sorted.
func (p ConfigPatch) Fields() []string {
	out := make([]string, 0, len(p.merge))
	for k := range p.merge {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Apply returns c with the patch merged into it. The error names the field
// whose merged value is not of the field's type.
func (p ConfigPatch) Apply(c BackendConfig) (BackendConfig, error) {
	b, err := stdjson.Marshal(c)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	var doc any
	if err := stdjson.Unmarshal(b, &doc); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if m, ok := doc.(map[string]any); ok {
		for name, v := range p.merge {
			if atomicFields[name] && v != nil {
				delete(m, name) // replaced whole, not merged into
			}
		}
	}
	merged, err := stdjson.Marshal(MergePatch(doc, p.merge))
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	var out BackendConfig
	if err := DecodeJSON(merged, &out); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	return out, nil
}

// MergePatch applies patch to target as RFC 7386 says (section 2): a patch
// that is an object merges member by member, null removing a member;
// anything else replaces the target. Neither argument is modified.
func MergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	out := make(map[string]any, len(t)+len(p))
	if ok {
		for k, v := range t {
			out[k] = v
		}
	}
	for k, v := range p {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = MergePatch(out[k], v)
	}
	return out
}

// BackendConfigPatch is a typed way to write, in Go, a merge patch of a
// BackendConfig (ConfigPatch, which is what the API takes): the fields
// that are set change, as in Ray Serve's update_backend_config. It names
// the fields its previous release's clients sent, with their removal
// conventions; a field added since is patched with ParseConfigPatch.
type BackendConfigPatch struct {
	MaxConcurrentQueries *int     `json:"max_concurrent_queries,omitempty"`
	NumReplicas          *int     `json:"num_replicas,omitempty"`
	CPUs                 *float64 `json:"cpus,omitempty"`
	MemoryMB             *int     `json:"memory_mb,omitempty"`
	HoldTimeoutS         *float64 `json:"hold_timeout_s,omitempty"`
	// GracefulShutdownTimeoutS, as the config's (0: the default).
	GracefulShutdownTimeoutS *float64 `json:"graceful_shutdown_timeout_s,omitempty"`
	// Resources replaces the named resources one replica needs ({} none).
	Resources map[string]int `json:"resources,omitempty"`
	// UserConfig replaces the user_config; null removes it.
	UserConfig *UserConfig `json:"user_config,omitempty"`
	MaxHeld    *int        `json:"max_held,omitempty"`
	// FirstByteTimeoutS, as the config's (0: no bound).
	FirstByteTimeoutS *float64 `json:"first_byte_timeout_s,omitempty"`
	// Autoscaling replaces the autoscaling config; an empty one
	// ({"max_replicas": 0}) turns autoscaling off.
	Autoscaling *AutoscalingConfig `json:"autoscaling,omitempty"`
	// LoadAware replaces the load-aware setting ({} turns it on without
	// reading metrics); {"off": true} turns it off.
	LoadAware *LoadAwarePatch `json:"load_aware,omitempty"`
	// EndpointPicker sets the fields of the external picker it names (a
	// merge patch's null removes the picker).
	EndpointPicker *EndpointPickerPatch `json:"endpoint_picker,omitempty"`
	// Replicas replaces the replicas of a backend of listed replicas (not
	// of a process or external one).
	Replicas []ReplicaSpec `json:"replicas,omitempty"`
}

// EndpointPickerPatch sets the fields of an endpoint picker it names.
type EndpointPickerPatch struct {
	Address  string `json:"address,omitempty"`
	TLS      *bool  `json:"tls,omitempty"`
	FailOpen *bool  `json:"fail_open,omitempty"`
}

// MergePatch is the patch as a JSON merge patch: its set fields, with the
// previous release's removal conventions ({"off": true}, an empty
// autoscaling config, resources {}) read as null.
func (p BackendConfigPatch) MergePatch() (ConfigPatch, error) {
	b, err := stdjson.Marshal(p) // its omitempty keeps a set pointer to an empty struct ({} turns load_aware on)
	if err != nil {
		return ConfigPatch{}, fmt.Errorf("patch: %w", err)
	}
	if p.Resources != nil && len(p.Resources) == 0 { // {}: no resources, which omitempty would drop
		var doc map[string]any
		if err := stdjson.Unmarshal(b, &doc); err != nil {
			return ConfigPatch{}, fmt.Errorf("patch: %w", err)
		}
		doc["resources"] = nil
		if b, err = stdjson.Marshal(doc); err != nil {
			return ConfigPatch{}, fmt.Errorf("patch: %w", err)
		}
	}
	return ParseConfigPatch(b)
}

// Config is the config the patch makes of none: what a backend created
// with these settings has.
func (p BackendConfigPatch) Config() (BackendConfig, error) {
	if b, err := stdjson.Marshal(p); err == nil && string(b) == "{}" {
		return BackendConfig{}, nil
	}
	mp, err := p.MergePatch()
	if err != nil {
		return BackendConfig{}, err
	}
	return mp.Apply(BackendConfig{})
}
