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
//     node, inbound listener and health), by backend name.
//  2. Lower makes the IR of the two once per change, reading the state as
//     it is (nothing cleared, nothing validated again): how every node
//     reaches each backend (Reach), its effective limits, whether the
//     activator and the picker front it, each endpoint's allowed methods
//     and effective settings. It validates the IR (DataPlane.Validate),
//     which checks the catalog's replicas too: an IR translation cannot
//     serve is refused here, and the data plane keeps the last one.
//  3. Translation (xds/translate, step 6) reads only the IR and trusts
//     it: no user type, no validation, no defaults.
//
// The IR is serialisable (JSON and YAML): xds/translate's golden tests
// write each input's IR next to its Envoy resources.
package ir
