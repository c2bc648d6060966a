package picker

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestPickerServerSpeaksExtProc: through a real gRPC stream on the unix
// socket, as the node's Envoy calls it: the request's headers get the
// replica as the Endpoint Picker Protocol names it (dynamic metadata and
// a header, and the metadata key of the previous release), or a 429 with
// Retry-After for a shed one; the answer's headers, which come with the
// replica that served it, get the load report, replacing the replica's
// own, and the served replica is counted.
func TestPickerServerSpeaksExtProc(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	srv := NewServer(p, slog.New(slog.DiscardHandler), nil, nil)
	client, ctx := pickerClientOf(t, srv)
	var err error
	ask := func(criticality string) (*extproc.ProcessingResponse, extproc.ExternalProcessor_ProcessClient) {
		t.Helper()
		var stream extproc.ExternalProcessor_ProcessClient
		for deadline := time.Now().Add(5 * time.Second); ; {
			stream, err = client.Process(metadata.AppendToOutgoingContext(ctx, wire.BackendHeader, "llama"))
			if err == nil {
				err = stream.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{
					Headers: &core.HeaderMap{Headers: []*core.HeaderValue{{Key: meshspec.CriticalityHeader, RawValue: []byte(criticality)}}}}}})
			}
			var resp *extproc.ProcessingResponse
			if err == nil {
				resp, err = stream.Recv()
			}
			if err == nil {
				return resp, stream
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // the server is starting
		}
	}
	resp, stream := ask("sheddable")
	picked := pickedOf(resp)
	named := resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if picked != "127.0.0.1:9001" || previousKeyOf(resp) != picked || len(named) != 1 || named[0].GetHeader().GetKey() != wire.DestinationEndpointKey ||
		string(named[0].GetHeader().GetRawValue()) != picked || named[0].GetAppendAction() != core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
		t.Fatalf("picked %q (%v), want the first idle replica, named in %s's metadata and header (replacing any) and by the previous key", picked, resp, wire.DestinationEndpointKey)
	}
	served := &core.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.PickerNamespace: {Fields: map[string]*structpb.Value{
		wire.DestinationEndpointServedKey: structpb.NewStringValue(picked)}}}}
	if err := stream.Send(&extproc.ProcessingRequest{MetadataContext: served, Request: &extproc.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extproc.HttpHeaders{}}}); err != nil {
		t.Fatal(err)
	}
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	set := resp.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(set) != 1 || set[0].GetHeader().GetKey() != wire.LoadReportHeader || !strings.HasPrefix(string(set[0].GetHeader().GetRawValue()), "TEXT application_utilization=") ||
		set[0].GetAppendAction() != core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
		t.Fatalf("answer's headers: %v, want the load report replacing any", set)
	}
	if got := promtestutil.ToFloat64(srv.served.WithLabelValues("llama", ServedPicked)); got != 1 {
		t.Fatalf("answers served by the replica picked: %v, want 1", got)
	}
	_ = stream.CloseSend()
	for range 6 { // fill every replica (2 each)
		if r, _ := ask("critical"); r.GetImmediateResponse() != nil {
			t.Fatalf("a critical request was refused: %v", r)
		}
	}
	resp, _ = ask("sheddable")
	shed := resp.GetImmediateResponse()
	if shed.GetStatus().GetCode() != 429 || len(shed.GetHeaders().GetSetHeaders()) != 1 || shed.GetHeaders().GetSetHeaders()[0].GetHeader().GetKey() != "retry-after" {
		t.Errorf("a sheddable request with every replica saturated got %v, want 429 with Retry-After", resp)
	}
}

// TestPickerServerPicksOnTheBody: with the body sent (PickerBodyHeader),
// the request's headers are answered without a pick and its body with
// the replica, the one holding the prompt's prefix; a request without a
// body (headers ending the stream) is picked on its headers.
func TestPickerServerPicksOnTheBody(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	client, ctx := pickerClient(t, p)
	body := []byte(`{"prompt":"` + strings.Repeat("z", 8*prefix.BlockBytes) + `"}`)
	p.mu.Lock()
	p.replicas["llama#000003"].cache.Add(prefix.Blocks(body, prefix.BlockBytes)) // it served this prompt
	p.mu.Unlock()
	stream, err := client.Process(metadata.AppendToOutgoingContext(ctx, wire.BackendHeader, "llama", wire.PickerBodyHeader, "1"))
	if err != nil {
		t.Fatal(err)
	}
	send := func(r *extproc.ProcessingRequest) *extproc.ProcessingResponse {
		t.Helper()
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	headers := send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{}}})
	if headers.GetRequestHeaders() == nil || headers.GetDynamicMetadata() != nil {
		t.Fatalf("the headers of a request with a body were answered %v, want a pass with no pick", headers)
	}
	resp := send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestBody{RequestBody: &extproc.HttpBody{Body: body, EndOfStream: true}}})
	if got := pickedOf(resp); resp.GetRequestBody() == nil || got != "127.0.0.1:9003" {
		t.Fatalf("the body was answered %v (picked %q), want 9003, which holds the prompt", resp, got)
	}
	_ = stream.CloseSend()
	bodiless, err := client.Process(metadata.AppendToOutgoingContext(ctx, wire.BackendHeader, "llama", wire.PickerBodyHeader, "1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := bodiless.Send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := bodiless.Recv(); err != nil || pickedOf(resp) == "" {
		t.Fatalf("a request without a body: %v %v, want picked on its headers", resp, err)
	}
}

// pickedOf is the replica resp names (wire.DestinationEndpointKey).
func pickedOf(resp *extproc.ProcessingResponse) string {
	return resp.GetDynamicMetadata().GetFields()[wire.PickerNamespace].GetStructValue().GetFields()[wire.DestinationEndpointKey].GetStringValue()
}

// previousKeyOf is the replica resp names by the previous release's key.
func previousKeyOf(resp *extproc.ProcessingResponse) string {
	return resp.GetDynamicMetadata().GetFields()[wire.PickerNamespace].GetStructValue().GetFields()[wire.PickedReplicaKey].GetStringValue()
}

// pickerClient serves p on a unix socket and returns an ext_proc client
// of it, once it answers.
func pickerClient(t *testing.T, p *Picker) (extproc.ExternalProcessorClient, context.Context) {
	t.Helper()
	return pickerClientOf(t, NewServer(p, slog.New(slog.DiscardHandler), nil, nil))
}

// askPrompt sends a calling node's prompt stream (md: more metadata, name
// and value pairs) a request's headers and its body, and returns the
// picker's two answers.
func askPrompt(ctx context.Context, t *testing.T, client extproc.ExternalProcessorClient, headers *extproc.HttpHeaders, body string, md ...string) []*extproc.ProcessingResponse {
	t.Helper()
	stream, err := client.Process(metadata.AppendToOutgoingContext(ctx, append([]string{wire.PickerPromptHeader, "1"}, md...)...))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.CloseSend() }()
	var out []*extproc.ProcessingResponse
	for _, req := range []*extproc.ProcessingRequest{
		{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: headers}},
		{Request: &extproc.ProcessingRequest_RequestBody{RequestBody: &extproc.HttpBody{Body: []byte(body), EndOfStream: true}}},
		{Request: &extproc.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extproc.HttpHeaders{}}}, // the answer began
	} {
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp)
	}
	return out
}

// pickerClientOf is pickerClient of the server s.
func pickerClientOf(t *testing.T, s *Server) (extproc.ExternalProcessorClient, context.Context) {
	t.Helper()
	dir, err := os.MkdirTemp("", "picker")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = s.Serve(ctx, dir) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, wire.PickerSocket), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix://"))
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	testutil.WaitFor(t, 5*time.Second, "the picker's socket", func() bool {
		_, err := os.Stat(filepath.Join(dir, wire.PickerSocket))
		return err == nil
	})
	return extproc.NewExternalProcessorClient(conn), ctx
}

// TestPickerHonoursTheSubsetHint: a request whose metadata carries the
// Endpoint Picker Protocol's subset hint goes only to a replica it names
// (as a list or a comma-separated string); one naming no ready replica is
// answered 503.
func TestPickerHonoursTheSubsetHint(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	client, ctx := pickerClient(t, p)
	ask := func(hint *structpb.Value) *extproc.ProcessingResponse {
		t.Helper()
		stream, err := client.Process(metadata.AppendToOutgoingContext(ctx, wire.BackendHeader, "llama"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = stream.CloseSend() }()
		md := &core.Metadata{FilterMetadata: map[string]*structpb.Struct{wire.SubsetHintNamespace: {Fields: map[string]*structpb.Value{wire.SubsetHintKey: hint}}}}
		if err := stream.Send(&extproc.ProcessingRequest{MetadataContext: md, Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{EndOfStream: true}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	list, _ := structpb.NewList([]any{"10.9.9.9:1", "127.0.0.1:9003"})
	for _, hint := range []*structpb.Value{structpb.NewListValue(list), structpb.NewStringValue("10.9.9.9:1, 127.0.0.1:9003")} {
		for range 3 { // not merely the first idle replica
			if got := pickedOf(ask(hint)); got != "127.0.0.1:9003" {
				t.Fatalf("subset hint %v: picked %q, want 127.0.0.1:9003, the one ready replica it names", hint, got)
			}
		}
	}
	resp := ask(structpb.NewStringValue("10.9.9.9:1"))
	if got := resp.GetImmediateResponse().GetStatus().GetCode(); got != 503 || pickedOf(resp) != "" {
		t.Fatalf("a subset hint naming no ready replica: %v, want 503 and no replica named", resp)
	}
}
