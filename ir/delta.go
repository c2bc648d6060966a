package ir

import (
	"maps"
	"slices"
)

// Delta names what changed in a DataPlane since the one numbered Since
// (DataPlane.Seq): the backends and endpoints whose IR may differ, added
// or gone. What it does not name is the same as in that data plane. It is
// carried from its source (the stored state's change, the catalog's
// services that changed) through the publisher, which lowers only what it
// names (LowerDelta), to the builder, which rebuilds only what it names;
// a nil Delta, one with All, or one that follows another data plane than
// the reader's last says nothing: the reader compares everything (a
// fresh start, and the test oracle).
type Delta struct {
	Since     uint64
	All       bool
	Backends  map[string]struct{}
	Endpoints map[string]struct{}
}

// Follows reports whether d names every change since the data plane
// numbered seq: it is set, not All, and it follows that data plane.
func (d *Delta) Follows(seq uint64) bool {
	return d != nil && !d.All && d.Since == seq && seq != 0
}

// AddBackends names backends in d.
func (d *Delta) AddBackends(names ...string) {
	if d.Backends == nil {
		d.Backends = make(map[string]struct{}, len(names))
	}
	for _, n := range names {
		d.Backends[n] = struct{}{}
	}
}

// AddEndpoints names endpoints in d.
func (d *Delta) AddEndpoints(names ...string) {
	if d.Endpoints == nil {
		d.Endpoints = make(map[string]struct{}, len(names))
	}
	for _, n := range names {
		d.Endpoints[n] = struct{}{}
	}
}

// Empty reports whether d names nothing and is not All.
func (d *Delta) Empty() bool {
	return d != nil && !d.All && len(d.Backends) == 0 && len(d.Endpoints) == 0
}

// Then is d followed by next, a Delta since the data plane d led to
// (numbered seq): what changed since d.Since. It is All unless both name
// their changes and next follows seq.
func (d *Delta) Then(seq uint64, next *Delta) *Delta {
	if d == nil || d.All || next == nil || next.All || next.Since != seq {
		return &Delta{All: true}
	}
	out := &Delta{Since: d.Since, Backends: maps.Clone(d.Backends), Endpoints: maps.Clone(d.Endpoints)}
	out.AddBackends(slices.Collect(maps.Keys(next.Backends))...)
	out.AddEndpoints(slices.Collect(maps.Keys(next.Endpoints))...)
	return out
}

// SortedBackends are the backends d names, sorted.
func (d *Delta) SortedBackends() []string { return slices.Sorted(maps.Keys(d.Backends)) }

// SortedEndpoints are the endpoints d names, sorted.
func (d *Delta) SortedEndpoints() []string { return slices.Sorted(maps.Keys(d.Endpoints)) }
