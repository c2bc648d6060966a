// Package ir is the data plane's intermediate representation: what
// translation (xds/translate) turns into Envoy resources, with everything
// it needs already decided, in the shape of Envoy Gateway's internal/ir
// and Consul's ConfigSnapshot.
//
// In the flow of docs/architecture.md: steps 4 and 6.
//
//  1. The controller's publisher (controlplane/dataplane, step 4) takes
//     the stored state, validated there once in its role (meshspec's
//     Validate, as users' input was at the door), and each backend's
//     replicas from Consul's catalog and DNS (dataplane.Replicas: address,
//     node, inbound listener and health), by backend name, with what
//     changed since the last IR: a Delta, the backends and endpoints the
//     state's change touched and those whose services the catalog saw
//     change.
//  2. Lower makes the IR of the two, whole, at a fresh start; LowerDelta
//     makes the next one from the last, lowering only what the delta
//     names (and the endpoints that read a backend it names), reading the
//     state as it is (nothing cleared, nothing validated again): how every
//     node reaches each backend (Reach), its effective limits, whether the
//     activator and the picker front it, each endpoint's allowed methods
//     and effective settings. It validates what it lowered
//     (DataPlane.Validate, ValidateSince), which checks the catalog's
//     replicas too: an IR translation cannot serve is refused here, and
//     the data plane keeps the last one.
//  3. Translation (xds/translate, step 6) reads only the IR and trusts
//     it: no user type, no validation, no defaults. Its builder rebuilds
//     what the IR's delta names when the delta follows the IR it built
//     last (Delta.Follows), and compares everything otherwise.
//
// The IR is serialisable (JSON and YAML): xds/translate's golden tests
// write each input's IR next to its Envoy resources.
package ir
