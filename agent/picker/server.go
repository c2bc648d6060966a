package picker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/internal/tracing"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Server serves the node's Picker to its Envoy: the ext_proc
// protocol on wire.PickerSocket, one stream per request of a load-aware
// backend (the backend named in the stream's metadata). On the request's
// headers (or body) it answers with the replica picked, as the Endpoint
// Picker Protocol says (named), or a 429 with Retry-After for a shed
// request; on the answer's headers, which come with the replica that
// served it, with the node's load report.
type Server struct {
	extproc.UnimplementedExternalProcessorServer
	picker   *Picker
	log      *slog.Logger
	outcomes *prometheus.CounterVec
	queued   *prometheus.CounterVec
	rewrites *prometheus.CounterVec
	// prompts counts the requests picked with a prompt read, by whether
	// the replica picked was expected to hold part of it (hit, miss).
	prompts *prometheus.CounterVec
	// released counts affinities released for queued prefill.
	released *prometheus.CounterVec
	// served counts the answers the inbound cluster reports a replica
	// served, by whether it was the one picked.
	served *prometheus.CounterVec
	meta   routeMeta // routes' affinity nodes and rewrites, parsed
	tracer *tracing.Tracer
}

// Outcomes of a request the picker was asked about, as counted.
const (
	PickPicked = "picked" // a replica was named
	PickShed   = "shed"   // 429: sheddable with every replica saturated, or no room or time to wait
	PickNone   = "none"   // no ready replica here: Envoy's own choice
	// PickUnservable: 503, no ready replica among those the request's
	// subset hint (the Endpoint Picker Protocol's) names.
	PickUnservable = "unservable"
)

// ShedRetryAfter is the Retry-After, in seconds, of a shed request.
const ShedRetryAfter = "1"

// NewServer returns a server of p; reg (nil: none) receives its
// metrics, tr (nil: none) its spans: one per pick ("pick <backend>"), the
// child of the span of Envoy's call to it.
func NewServer(p *Picker, log *slog.Logger, reg prometheus.Registerer, tr *tracing.Tracer) *Server {
	s := &Server{picker: p, log: log, meta: newRouteMeta(), tracer: tr, outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "servemesh_picker_requests_total",
		Help: "Requests of load-aware backends this node's picker was asked about, by outcome: picked (a replica named), shed (429: sheddable with every replica here saturated, or the queue full or its wait too long), none (no ready replica here), unservable (503: no ready replica among those the request's subset hint names).",
	}, []string{"backend", "outcome"}), queued: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "servemesh_picker_queued_total",
		Help: "Requests of load-aware backends that waited on this node for a replica (every one saturated), whatever their outcome.",
	}, []string{"backend"}), rewrites: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "servemesh_picker_model_rewrites_total",
		Help: "Requests this node sent whose model its picker rewrote (model_routing.models.<model>.rewrite), by the model asked for and the one it was rewritten to.",
	}, []string{"from", "to"}), prompts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "servemesh_picker_prompts_total",
		Help: "Requests with a prompt this node's picker read and gave a replica, by backend and whether that replica was expected to hold part of the prompt in its prefix cache (hit) or none of it (miss): the picker's prompt hit rate.",
	}, []string{"backend", "cache"}), released: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "servemesh_picker_affinity_released_total",
		Help: "Requests of load-aware backends with a TTFT budget (load_aware.ttft_budget_ms) that this node's picker gave another replica than their affinity target (target: session, model or home), since the target's queued prefill with theirs would have passed the budget.",
	}, []string{"backend", "target"}), served: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "servemesh_picker_served_total",
		Help: "Answers of requests this node's picker gave a replica, by backend and the replica that served them as Envoy reports it (the Endpoint Picker Protocol's x-gateway-destination-endpoint-served): picked (the one the picker named), other (Envoy sent the request elsewhere: the replica named had left its cluster or failed its health checks), unreported (no report: an Envoy without it).",
	}, []string{"backend", "replica"})}
	if reg != nil {
		reg.MustRegister(s.outcomes, s.queued, s.rewrites, s.prompts, s.released, s.served)
	}
	return s
}

// Which replica served a request, against the one picked
// (servemesh_picker_served_total).
const (
	ServedPicked     = "picked"
	ServedOther      = "other"
	ServedUnreported = "unreported"
)

// countServed counts the answer to a request picked c by the replica
// served names.
func (s *Server) countServed(backend string, c choice, served string) {
	outcome := ServedPicked
	switch {
	case served == "":
		outcome = ServedUnreported
	case served != c.replica.addr:
		outcome = ServedOther
		s.log.Debug("a request was served by another replica than the one picked", "backend", backend, "picked", c.replica.addr, "served", served)
	}
	s.served.WithLabelValues(backend, outcome).Inc()
}

// Serve listens on the picker's socket in dir (the node's Envoy's folder)
// until ctx ends.
func (s *Server) Serve(ctx context.Context, dir string) error {
	l, path, err := envoy.ListenSocket(ctx, dir, wire.PickerSocket)
	if err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	srv := grpc.NewServer()
	extproc.RegisterExternalProcessorServer(srv, s)
	s.log.Info("picker serving: the node's replicas of load-aware backends are picked here", "socket", path)
	err = rungroup.ServeGRPC(ctx, srv, l)
	if err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	return nil
}

// Process answers one request's questions: which replica, then its load
// report; or, asked by an outbound listener (wire.PickerPromptHeader),
// the prefix of its prompt (prompt).
func (s *Server) Process(stream extproc.ExternalProcessor_ProcessServer) error {
	backend, withBody, sessionHeader, modelHeader, tenantHeader := "", false, "", "", ""
	md, ok := metadata.FromIncomingContext(stream.Context())
	if ok {
		if len(md.Get(wire.PickerPromptHeader)) > 0 {
			return s.prompt(stream, md)
		}
		if v := md.Get(wire.BackendHeader); len(v) > 0 {
			backend = v[0]
		}
		if v := md.Get(wire.PickerSessionHeader); len(v) > 0 {
			sessionHeader = v[0]
		}
		if v := md.Get(wire.PickerModelHeader); len(v) > 0 {
			modelHeader = v[0]
		}
		if v := md.Get(wire.PickerTenantHeader); len(v) > 0 {
			tenantHeader = v[0]
		}
		withBody = len(md.Get(wire.PickerBodyHeader)) > 0
	}
	var picked choice
	var sent time.Time
	var ask request
	defer func() {
		if picked.replica != nil { // the answer never came (a reset, a timeout)
			s.picker.done(picked, 0, 0)
		}
	}()
	return answerEach(stream, func(req *extproc.ProcessingRequest) (*extproc.ProcessingResponse, error) {
		var resp *extproc.ProcessingResponse
		switch r := req.Request.(type) {
		case *extproc.ProcessingRequest_RequestHeaders:
			ask.subset = subsetHint(req)
			ask.priority = requestPriority(r.RequestHeaders.GetHeaders())
			ask.deadline = requestDeadline(r.RequestHeaders.GetHeaders(), s.picker.now())
			if tenantHeader != "" {
				ask.tenant = truncate(headerValue(r.RequestHeaders.GetHeaders(), tenantHeader), maxTenantBytes)
			}
			if sessionHeader != "" {
				ask.session = headerValue(r.RequestHeaders.GetHeaders(), sessionHeader)
			}
			if modelHeader != "" {
				ask.model = headerValue(r.RequestHeaders.GetHeaders(), modelHeader)
			}
			if withBody && !r.RequestHeaders.GetEndOfStream() {
				resp = headersAnswer() // picked on the body, which comes next
				break
			}
			c, err := s.tracedPick(stream, md, backend, ask)
			if err != nil {
				return nil, err
			}
			resp = s.answerRequest(backend, c, headersAnswer)
			picked, sent = c, s.picker.now()
		case *extproc.ProcessingRequest_RequestBody:
			ask.blocks = prefix.Blocks(r.RequestBody.GetBody(), prefix.BlockBytes)
			if modelHeader != "" && ask.model == "" {
				ask.model = bodyModel(r.RequestBody.GetBody())
			}
			c, err := s.tracedPick(stream, md, backend, ask)
			if err != nil {
				return nil, err
			}
			resp = s.answerRequest(backend, c, bodyAnswer)
			picked, sent = c, s.picker.now()
		case *extproc.ProcessingRequest_ResponseHeaders:
			if picked.replica != nil {
				status, _ := strconv.Atoi(headerValue(r.ResponseHeaders.GetHeaders(), ":status"))
				s.countServed(backend, picked, servedBy(req))
				s.picker.done(picked, s.picker.now().Sub(sent), status)
				picked = choice{}
			}
			resp = &extproc.ProcessingResponse{Response: &extproc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extproc.HeadersResponse{
				Response: &extproc.CommonResponse{HeaderMutation: &extproc.HeaderMutation{SetHeaders: []*core.HeaderValueOption{{
					Header:       &core.HeaderValue{Key: wire.LoadReportHeader, RawValue: []byte(s.picker.Report(backend))},
					AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, // never the replica's own
				}}}}}}}
		default:
			return nil, fmt.Errorf("picker: asked about %T, which its filter does not send", r)
		}
		return resp, nil
	})
}

// answerEach answers each message of stream with answer's response, until
// Envoy ends the stream or answer or a send fails.
func answerEach(stream extproc.ExternalProcessor_ProcessServer, answer func(*extproc.ProcessingRequest) (*extproc.ProcessingResponse, error)) error {
	for {
		req, err := next(stream)
		if req == nil {
			return err // nil: the stream ended
		}
		resp, err := answer(req)
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// next is the stream's next message, or nil and nil when Envoy closed it
// or its request ended, or nil and the error.
func next(stream extproc.ExternalProcessor_ProcessServer) (*extproc.ProcessingRequest, error) {
	req, err := stream.Recv()
	if errors.Is(err, io.EOF) || stream.Context().Err() != nil {
		return nil, nil //nolint:nilerr // Envoy ended the stream: no failure
	}
	return req, err
}

// headersAnswer and bodyAnswer go on answering a request's headers or
// its body.
var (
	headersAnswer = func() *extproc.ProcessingResponse {
		return &extproc.ProcessingResponse{Response: &extproc.ProcessingResponse_RequestHeaders{RequestHeaders: &extproc.HeadersResponse{}}}
	}
	bodyAnswer = func() *extproc.ProcessingResponse {
		return &extproc.ProcessingResponse{Response: &extproc.ProcessingResponse_RequestBody{RequestBody: &extproc.BodyResponse{}}}
	}
)

// answerRequest is the answer to a request's headers or body (goOn says
// which): the replica picked, a 429, or nothing (Envoy picks).
func (s *Server) answerRequest(backend string, c choice, goOn func() *extproc.ProcessingResponse) *extproc.ProcessingResponse {
	switch {
	case c.shed:
		s.outcomes.WithLabelValues(backend, PickShed).Inc()
		return &extproc.ProcessingResponse{Response: &extproc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extproc.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: &extproc.HeaderMutation{SetHeaders: []*core.HeaderValueOption{{
				Header: &core.HeaderValue{Key: "retry-after", RawValue: []byte(ShedRetryAfter)}}}},
			Body:    []byte(shedMessage(backend, c.why)),
			Details: "servemesh_shed",
		}}}
	case c.unservable:
		s.outcomes.WithLabelValues(backend, PickUnservable).Inc()
		return &extproc.ProcessingResponse{Response: &extproc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extproc.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
			Body:    []byte(fmt.Sprintf("servemesh: backend %q: %s (%s)\n", backend, c.why, wire.SubsetHintKey)),
			Details: "servemesh_no_replica_in_subset",
		}}}
	case c.replica == nil:
		s.outcomes.WithLabelValues(backend, PickNone).Inc()
		return goOn()
	}
	s.outcomes.WithLabelValues(backend, PickPicked).Inc()
	if c.pass.Released != "" {
		s.released.WithLabelValues(backend, c.pass.Released).Inc()
	}
	if c.prompted {
		s.prompts.WithLabelValues(backend, map[bool]string{true: "hit", false: "miss"}[c.prefixHit > 0]).Inc()
	}
	return named(goOn(), c.replica.addr)
}

// named is resp naming replica (IP:port) as the Endpoint Picker Protocol
// has a picker name the endpoint it chose: in dynamic metadata and in the
// request header, both wire.DestinationEndpointKey, the metadata also by
// the key a previous release's inbound cluster follows (while an upgrade
// is rolled out).
func named(resp *extproc.ProcessingResponse, replica string) *extproc.ProcessingResponse {
	resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
		wire.PickerNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			wire.DestinationEndpointKey: structpb.NewStringValue(replica),
			wire.PickedReplicaKey:       structpb.NewStringValue(replica)}}),
	}}
	var common *extproc.CommonResponse
	switch r := resp.Response.(type) {
	case *extproc.ProcessingResponse_RequestHeaders:
		common = &extproc.CommonResponse{}
		r.RequestHeaders.Response = common
	case *extproc.ProcessingResponse_RequestBody:
		common = &extproc.CommonResponse{}
		r.RequestBody.Response = common
	default:
		return resp
	}
	common.HeaderMutation = &extproc.HeaderMutation{SetHeaders: []*core.HeaderValueOption{{
		Header:       &core.HeaderValue{Key: wire.DestinationEndpointKey, RawValue: []byte(replica)},
		AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}}}
	return resp
}

// subsetHint are the endpoints the Endpoint Picker Protocol's subset hint
// in req's metadata names (a list of "IP:port", or a comma-separated
// string, or a list of those), nil if it names none.
func subsetHint(req *extproc.ProcessingRequest) map[string]bool {
	v, ok := req.GetMetadataContext().GetFilterMetadata()[wire.SubsetHintNamespace].GetFields()[wire.SubsetHintKey]
	if !ok {
		return nil
	}
	subset := map[string]bool{}
	add := func(s string) {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				subset[e] = true
			}
		}
	}
	add(v.GetStringValue())
	for _, e := range v.GetListValue().GetValues() {
		add(e.GetStringValue())
	}
	return subset
}

// servedBy is the replica the inbound cluster reports served a request
// (wire.DestinationEndpointServedKey, in the metadata Envoy sends with the
// answer's headers), "" if it reports none.
func servedBy(req *extproc.ProcessingRequest) string {
	ns := req.GetMetadataContext().GetFilterMetadata()[wire.PickerNamespace]
	return ns.GetFields()[wire.DestinationEndpointServedKey].GetStringValue()
}

// tracedPick is pick in a span, the child of the trace context Envoy sent
// in md: the replica picked and why, or why none, the request's pass
// through the policy's pipeline, and how long the request waited for one.
func (s *Server) tracedPick(stream extproc.ExternalProcessor_ProcessServer, md metadata.MD, backend string, ask request) (choice, error) {
	_, span := s.tracer.Start(stream.Context(), "pick "+backend, tracing.MetadataCarrier(md), trace.SpanKindInternal,
		attribute.String(wire.TagBackend, backend))
	defer span.End()
	start := s.picker.now()
	c, err := s.pick(stream, backend, ask)
	if !span.IsRecording() {
		return c, err
	}
	outcome := PickPicked
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case c.shed:
		outcome = PickShed
	case c.replica == nil:
		outcome = PickNone
	default:
		span.SetAttributes(attribute.String(wire.TagReplica, c.replica.addr))
	}
	if len(c.pass.Steps) > 0 {
		span.SetAttributes(attribute.String(wire.TagPickPass, c.pass.String()))
	}
	span.SetAttributes(attribute.String(wire.TagOutcome, outcome), attribute.String(wire.TagWhy, c.why),
		attribute.Float64(wire.TagHeldMS, float64(s.picker.now().Sub(start).Microseconds())/1000))
	return c, err // never the tenant: it may be an API key
}

// pick is the picker's choice for the request ask, waiting for it while
// the request waits for a replica: Envoy is first told to give the answer
// that long (and a second).
func (s *Server) pick(stream extproc.ExternalProcessor_ProcessServer, backend string, ask request) (choice, error) {
	c, w := s.picker.pick(backend, ask)
	if w == nil {
		return c, nil
	}
	s.queued.WithLabelValues(backend).Inc()
	timeout := time.Duration(s.picker.flowControl(backend).EffectiveQueueTimeoutS() * float64(time.Second))
	if err := stream.Send(&extproc.ProcessingResponse{OverrideMessageTimeout: durationpb.New(timeout + time.Second)}); err != nil {
		if c := s.picker.wait(canceled, w, 0); c.replica != nil { // out of the queue
			s.picker.done(c, 0, 0)
		}
		return choice{}, err
	}
	return s.picker.wait(stream.Context(), w, timeout), nil
}

// canceled is a context already ended.
var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// shedMessage is the body of a shed request's 429.
func shedMessage(backend, why string) string {
	switch why {
	case shedQueueFull:
		return fmt.Sprintf("backend %q is saturated on this node and its queue is full of requests of this priority or higher; retry after %s s\n", backend, ShedRetryAfter)
	case shedTimedOut:
		return fmt.Sprintf("backend %q stayed saturated on this node for as long as this request could wait (load_aware.queue_timeout_s); retry after %s s\n", backend, ShedRetryAfter)
	case shedLate:
		return fmt.Sprintf("backend %q cannot answer this request within the time to first token it states (%s): its replicas here take longer (load_aware.refuse_late); retry later, or state a longer objective\n", backend, wire.TTFTObjectiveHeader)
	}
	return fmt.Sprintf("backend %q is saturated on this node; this sheddable request was refused, retry after %s s or send it as %s: %s\n", backend, ShedRetryAfter, meshspec.CriticalityHeader, meshspec.Critical)
}

// maxTenantBytes bounds the tenant key a request names.
const maxTenantBytes = 256

func truncate(v string, n int) string {
	if len(v) > n {
		return v[:n]
	}
	return v
}

// requestPriority is a request's priority: what it asks for
// (meshspec.PriorityHeader) or else its route's, never more than its
// route allows (meshspec.PriorityLimitHeader; 0 without: critical), and
// below 0 when it is sheddable.
func requestPriority(h *core.HeaderMap) int {
	limit := 0
	if v, err := strconv.Atoi(headerValue(h, meshspec.PriorityLimitHeader)); err == nil {
		limit = v
	}
	p := limit
	if v, err := strconv.Atoi(headerValue(h, meshspec.PriorityHeader)); err == nil {
		p = v
	}
	p = min(p, limit)
	if headerValue(h, meshspec.CriticalityHeader) == string(meshspec.Sheddable) {
		p = min(p, -1)
	}
	return max(p, -meshspec.MaxPriority)
}

// requestDeadline is when a request's first token is due, now plus the
// objective it states (wire.TTFTObjectiveHeader, from 1 ms to
// wire.MaxTTFTObjectiveMS); zero when it states none it may.
func requestDeadline(h *core.HeaderMap, now time.Time) time.Time {
	ms, err := strconv.Atoi(headerValue(h, wire.TTFTObjectiveHeader))
	if err != nil || ms < 1 || ms > wire.MaxTTFTObjectiveMS {
		return time.Time{}
	}
	return now.Add(time.Duration(ms) * time.Millisecond)
}

// headerValue is the value of header name in h ("" if absent).
func headerValue(h *core.HeaderMap, name string) string {
	for _, v := range h.GetHeaders() {
		if v.GetKey() == name {
			if len(v.GetRawValue()) > 0 {
				return string(v.GetRawValue())
			}
			return v.GetValue()
		}
	}
	return ""
}
