package meshspec

import (
	"reflect"
	"strings"
	"testing"
)

// TestEndpointPickerValidates: a process backend may name an external
// picker by IP:port; each bad setting is refused with its field and what
// to write, and nothing else is.
func TestEndpointPickerValidates(t *testing.T) {
	proc := &ProcessSpec{Command: "/opt/model/serve"}
	good := func() *Model {
		return &Model{Backends: []Backend{{Name: "pool", Process: proc,
			Config: BackendConfig{EndpointPicker: &EndpointPicker{Address: "10.0.0.5:9002", FailOpen: true}}}}}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a picker at 10.0.0.5:9002: %v", err)
	}
	for name, c := range map[string]struct {
		change func(b *Backend)
		want   string
	}{
		"no port":         {func(b *Backend) { b.Config.EndpointPicker.Address = "10.0.0.5" }, `config.endpoint_picker.address: "10.0.0.5" is not IP:port`},
		"a DNS name":      {func(b *Backend) { b.Config.EndpointPicker.Address = "epp.internal:9002" }, `config.endpoint_picker.address: host "epp.internal" of "epp.internal:9002" is not an IP address`},
		"port 0":          {func(b *Backend) { b.Config.EndpointPicker.Address = "10.0.0.5:0" }, `config.endpoint_picker.address: port "0" of "10.0.0.5:0": want a number from 1 to 65535`},
		"empty":           {func(b *Backend) { b.Config.EndpointPicker.Address = "" }, `config.endpoint_picker.address: "" is not IP:port`},
		"with load_aware": {func(b *Backend) { b.Config.LoadAware = &LoadAware{} }, "config.endpoint_picker: and load_aware both pick the backend's replicas; keep one"},
		"listed replicas": {func(b *Backend) { b.Process, b.Replicas = nil, []Replica{{Address: "10.0.0.1:80"}} },
			"config.endpoint_picker: needs replicas servemesh's agents run"},
	} {
		t.Run(name, func(t *testing.T) {
			m := good()
			c.change(&m.Backends[0])
			err := m.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want an error with %q", err, c.want)
			}
		})
	}
}

// TestEndpointPickerPatch: a merge patch sets the picker, changes one of
// its fields, and null removes it.
func TestEndpointPickerPatch(t *testing.T) {
	c := BackendConfig{}
	for _, step := range []struct {
		patch string
		want  *EndpointPicker
	}{
		{`{"endpoint_picker": {"address": "10.0.0.5:9002"}}`, &EndpointPicker{Address: "10.0.0.5:9002"}},
		{`{"endpoint_picker": {"fail_open": true}}`, &EndpointPicker{Address: "10.0.0.5:9002", FailOpen: true}},
		{`{"endpoint_picker": null}`, nil},
	} {
		p, err := ParseConfigPatch([]byte(step.patch))
		if err != nil {
			t.Fatalf("%s: %v", step.patch, err)
		}
		if c, err = p.Apply(c); err != nil {
			t.Fatalf("%s: %v", step.patch, err)
		}
		if !reflect.DeepEqual(c.EndpointPicker, step.want) {
			t.Fatalf("after %s: %+v, want %+v", step.patch, c.EndpointPicker, step.want)
		}
	}
}
