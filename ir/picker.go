package ir

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/servemesh/servemesh/meshspec"
)

// lowerPicker is a backend's endpoint picker as the data plane reaches it;
// nil if its address does not parse (validation refuses such a setting).
func lowerPicker(e meshspec.EndpointPicker) *EndpointPicker {
	host, port, err := net.SplitHostPort(e.Address)
	if err != nil {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	n, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || n == 0 {
		return nil
	}
	return &EndpointPicker{Host: ip.String(), Port: uint32(n), TLS: e.TLS, FailOpen: e.FailOpen}
}

// pickedBackends are the backends e sends or mirrors to that an external
// picker picks, with their healthy replicas, sorted by name.
func (dp *DataPlane) pickedBackends(e Endpoint) []PickedBackend {
	var out []PickedBackend
	for _, name := range e.backends() {
		b, ok := dp.Backend(name)
		if !ok || b.Picker == nil || slices.ContainsFunc(out, func(p PickedBackend) bool { return p.Name == name }) {
			continue
		}
		out = append(out, PickedBackend{Name: name, FailOpen: b.Picker.FailOpen, Endpoints: b.PickerEndpoints()})
	}
	slices.SortFunc(out, func(a, b PickedBackend) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// PickerEndpoints are b's healthy replicas as an external picker names
// them: the host of their node's inbound listener and their own port,
// sorted. Replicas whose addresses do not parse are left out.
func (b Backend) PickerEndpoints() []PickerEndpoint {
	var out []PickerEndpoint
	for _, r := range b.Replicas {
		if r.Health != Healthy || r.Inbound == "" {
			continue
		}
		node, _, err := net.SplitHostPort(r.Inbound)
		if err != nil {
			continue
		}
		_, port, err := net.SplitHostPort(r.Address)
		if err != nil {
			continue
		}
		out = append(out, PickerEndpoint{Endpoint: net.JoinHostPort(node, port), Inbound: r.Inbound, Local: r.Address})
	}
	slices.SortFunc(out, func(a, b PickerEndpoint) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out
}
