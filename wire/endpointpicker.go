package wire

import "time"

// An external endpoint picker (a backend's config.endpoint_picker; xds/
// translate's endpointpicker.go): each calling node's outbound listener
// asks it, over the Endpoint Picker Protocol (ext_proc, cluster
// EndpointPickerCluster(backend)), which replica takes a request. Around
// that ask, two Lua filters of the outbound chain speak for servemesh:
//
//  1. EndpointSubsetFilter puts the backend's healthy replicas, as the
//     picker names them (their node's address, their port), in the
//     protocol's subset hint (SubsetHintNamespace, SubsetHintKey).
//  2. The picker answers in PickerNamespace, DestinationEndpointKey.
//  3. EndpointRouteFilter keeps of that list the replicas of the
//     backend on the first one's node, in order: it names the node's
//     inbound listener (PickerNamespace, EndpointNodeKey), which the
//     backend's cluster of nodes follows, and puts the replicas, as that
//     node's listener knows them (on its loopback), in the request's
//     DestinationEndpointKey header, which the inbound cluster follows.
//     A list naming none of the backend's replicas is a 503.
//  4. The inbound listener answers with the replica that served, its node's
//     address and its port, in the DestinationEndpointServedKey header;
//     EndpointRouteFilter moves it to PickerNamespace, where the picker
//     is told it with the answer's headers.
const (
	EndpointSubsetFilter = "servemesh.endpoint_subset"
	EndpointRouteFilter  = "servemesh.endpoint_route"
	// EndpointNodeKey names the node's inbound listener ("IP:port") that
	// a calling node sends a picked request to.
	EndpointNodeKey = "x-servemesh-endpoint-node"
	// EndpointPickerWait bounds each wait for the picker's answer (Envoy's
	// message timeout); past it the backend's failure mode holds. A
	// picker may hold a request in its own queue (flow control) a while.
	EndpointPickerWait = 10 * time.Second
)

// EndpointPickerCluster is the cluster of backend's external picker on
// every node.
func EndpointPickerCluster(backend string) string { return "servemesh_epp_" + backend }
