package translate

import (
	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	fileaccesslog "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/wire"
)

// accessLogFields are what each line of a node's access log says of a
// request, as JSON: which listener took it, the endpoint (its route: a
// match rule's is "<endpoint>/match-<i>"), the backend and replica that
// answered (on the inbound listener, the replica itself; elsewhere, for a
// replica on another node, that node's inbound listener), the status,
// durations in milliseconds, bytes, Envoy's response flags, and for a
// mirrored copy the endpoint whose shadow it is (wire.ShadowHeader; logged
// by the node whose inbound listener receives it: Envoy logs nothing of the
// copies it sends, so a shadow served on the calling node itself is in no
// log).
var accessLogFields = map[string]string{
	"start":       "%START_TIME%",
	"route":       "%ROUTE_NAME%",
	"backend":     "%UPSTREAM_CLUSTER%",
	"replica":     "%UPSTREAM_HOST%",
	"method":      "%REQ(:METHOD)%",
	"path":        "%REQ(:PATH)%",
	"authority":   "%REQ(:AUTHORITY)%",
	"status":      "%RESPONSE_CODE%",
	"grpc_status": "%GRPC_STATUS_NUMBER%",
	"flags":       "%RESPONSE_FLAGS%",
	"duration_ms": "%DURATION%",
	"upstream_ms": "%RESPONSE_DURATION%",
	"bytes_in":    "%BYTES_RECEIVED%",
	"bytes_out":   "%BYTES_SENT%",
	"request_id":  "%REQ(X-REQUEST-ID)%",
	"shadow":      "%REQ(" + wire.ShadowHeader + ")%",
}

// accessLogs write a JSON line per request of the listener named listener
// to the node's access log (wire.AccessLogFile, relative to the folder its
// Envoy runs in, so that the configuration is the same on every node).
// Every connection manager of a listener name gets the same one, packed
// once, when the package loads, for each of wire's three listener names:
// an mTLS node has an inbound chain per backend it runs, and packing the
// format for each was a tenth of a full publish. Callers must not change
// what it returns.
func accessLogs(listener string) []*accesslog.AccessLog {
	if logs, ok := packedAccessLogs[listener]; ok {
		return logs
	}
	return packAccessLogs(listener)
}

// packedAccessLogs are accessLogs' answers for wire's listener names, a
// table made once (not a memo: it depends on nothing that changes).
var packedAccessLogs = map[string][]*accesslog.AccessLog{
	wire.PublicListener:  packAccessLogs(wire.PublicListener),
	wire.MeshListener:    packAccessLogs(wire.MeshListener),
	wire.InboundListener: packAccessLogs(wire.InboundListener),
}

// packAccessLogs builds accessLogs' answer for listener.
func packAccessLogs(listener string) []*accesslog.AccessLog {
	fields := map[string]any{}
	for k, v := range accessLogFields {
		fields[k] = v
	}
	fields["listener"] = listener
	format, err := structpb.NewStruct(fields)
	if err != nil {
		panic(err) // static strings
	}
	// Packed deterministically: the format is a map, and a configuration
	// that hashed differently at each build would be sent again each time.
	file := &anypb.Any{}
	err = anypb.MarshalFrom(file, &fileaccesslog.FileAccessLog{
		Path: wire.AccessLogFile,
		AccessLogFormat: &fileaccesslog.FileAccessLog_LogFormat{LogFormat: &core.SubstitutionFormatString{
			Format: &core.SubstitutionFormatString_JsonFormat{JsonFormat: format}}},
	}, proto.MarshalOptions{Deterministic: true})
	if err != nil {
		panic(err) // a static, valid message
	}
	return []*accesslog.AccessLog{{Name: "envoy.access_loggers.file", ConfigType: &accesslog.AccessLog_TypedConfig{TypedConfig: file}}}
}
