// Package ir is the data plane's intermediate representation: what
// translation (xds/translate) turns into Envoy resources, with everything
// it needs already decided, in the shape of Envoy Gateway's internal/ir
// and Consul's ConfigSnapshot.
//
// In the flow of docs/architecture.md: steps 4 and 6.
//
//  1. The controller's publisher (controlplane/dataplane, step 4) merges
//     the desired state with the health view into a view of the mesh, as
//     users' vocabulary (meshspec) says it: each backend's replicas with
//     address, node, inbound listener and health.
//  2. Lower makes the IR of that view once per change: how every node
//     reaches each backend (Reach), its effective limits, whether the
//     activator and the picker front it, each endpoint's allowed methods
//     and effective settings. It validates the view and then the IR
//     (DataPlane.Validate): a view the IR cannot serve is refused here,
//     with the field and the fix, and the data plane keeps the last one.
//  3. Translation (xds/translate, step 6) reads only the IR and trusts
//     it: no user type, no validation, no defaults.
//
// The IR is serialisable (JSON and YAML): xds/translate's golden tests
// write each input's IR next to its Envoy resources.
package ir
