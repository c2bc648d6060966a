// Package connect gets servemesh's identities from Consul's service-mesh
// CA (Connect): a leaf certificate for a service name, whose URI SAN is a
// SPIFFE id (spiffe://<trust domain>/ns/default/dc/<dc>/svc/<service>), and
// the CA's roots. The controller serves xDS with its leaf
// (ControllerService) and trusts the roots; a node's Envoy presents the
// leaf of wire.NodeService(id), which is how the xDS server knows which node a
// stream belongs to; each agent keeps its node's and its backends' leaves
// fresh for its Envoy; the controller calls agents' status listeners with
// its leaf, and they know it by it (peer.go). servemesh issues no
// certificate of its own. In the flow of docs/architecture.md: steps 7, 9
// and 11.
package connect
