package translate

import (
	"fmt"
	"slices"
	"time"

	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	grpcaccesslog "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	tracingtype "github.com/envoyproxy/go-control-plane/envoy/type/tracing/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	lua "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
)

// usageReaderFilter reads each answer of an endpoint that serves model
// traffic (ir.Endpoint.ReadsAnswers) into dynamic metadata
// (wire.UsageMetadata): its tokens, which the global rate limit filter
// charges when the answer ends (tokenQuotaLimits), and its GenAI signals
// (wire/genai.go), which the node's access log service sends its agent
// (answerSignalsLog) and the request's span carries. Off but on those
// endpoints' routes.
const usageReaderFilter = "servemesh.usage_reader"

// usageScript names usageSource among the filter's scripts.
const usageScript = "usage"

// usageSource notes when the request reached it, then reads the answer's
// body as it passes, chunk by chunk (Envoy neither buffers nor delays it:
// a stream stays a stream), for what OpenAI's API says of it: the last
// "total_tokens", "prompt_tokens" and "completion_tokens" (a JSON
// answer's usage, or a streamed answer's last chunk's) and the first
// "model". The tail of each chunk is kept, so a figure split between two
// chunks is read too. Server-sent events are counted as tokens where the
// answer states none. Where the route carries a token quota's weights
// (tokenWeights), the answer's weighted cost is set too. The time to the
// first byte, and for a streamed answer of two tokens or more the mean
// time between them, are set with them; an answer with no body sets
// nothing of the kind.
var usageSource = fmt.Sprintf(`function envoy_on_request(h)
  h:streamInfo():dynamicMetadata():set(%[1]q, %[2]q, h:timestamp())
end
function envoy_on_response(h)
  local start = (h:streamInfo():dynamicMetadata():get(%[1]q) or {})[%[2]q]
  local tail, total, input, output, cached, model = "", nil, nil, nil, nil, nil
  local first, last, events = nil, nil, 0
  for chunk in h:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      local now = h:timestamp()
      first = first or now
      last = now
      local bytes = chunk:getBytes(0, n)
      local s = tail .. bytes
      for v in string.gmatch(s, '"total_tokens"%%s*:%%s*(%%d+)') do total = v end
      for v in string.gmatch(s, '"prompt_tokens"%%s*:%%s*(%%d+)') do input = v end
      for v in string.gmatch(s, '"completion_tokens"%%s*:%%s*(%%d+)') do output = v end
      for v in string.gmatch(s, '"cached_tokens"%%s*:%%s*(%%d+)') do cached = v end
      model = model or string.match(s, '"model"%%s*:%%s*"([%%w%%._:/%%-]+)"')
      for _ in string.gmatch("\n" .. bytes, "\ndata:") do events = events + 1 end
      for _ in string.gmatch(bytes, "data: %%[DONE%%]") do events = events - 1 end
      tail = string.sub(s, -64)
    end
  end
  -- Envoy's objects do not outlive the reads above: take them again.
  local meta = h:streamInfo():dynamicMetadata()
  if total then meta:set(%[1]q, %[3]q, total) end
  local weights = h:metadata()
  if weights:get("input") then
    local inp, out, hit = tonumber(input), tonumber(output), tonumber(cached) or 0
    local cost = tonumber(total)
    if inp or out then
      hit = math.min(hit, inp or 0)
      cost = weights:get("input") * ((inp or 0) - hit) + weights:get("cached") * hit + weights:get("output") * (out or 0)
    end
    if cost then meta:set(%[1]q, %[9]q, string.format("%%d", math.ceil(cost))) end
  end
  if not first or not start then return end
  local tokens = tonumber(output) or events
  meta:set(%[1]q, %[4]q, first - start)
  if tokens > 0 then meta:set(%[1]q, %[5]q, tokens) end
  if input then meta:set(%[1]q, %[6]q, tonumber(input)) end
  if model and #model <= 128 then meta:set(%[1]q, %[7]q, model) end
  if events >= 2 and tokens >= 2 then meta:set(%[1]q, %[8]q, (last - first) / (tokens - 1)) end
end`, wire.UsageMetadata, wire.UsageStartKey, wire.UsageTokensKey, wire.UsageTTFTKey, wire.UsageOutputTokensKey,
	wire.UsageInputTokensKey, wire.UsageModelKey, wire.UsageInterTokenKey, wire.UsageCostKey)

// usageReader is the filter on a listener: its own script is empty, so
// it reads nothing but on a route that names usageScript.
func usageReader(in filterInput) (*hcm.HttpFilter, error) {
	config, err := anypb.New(&lua.Lua{
		DefaultSourceCode: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: ""}},
		SourceCodes:       map[string]*core.DataSource{usageScript: {Specifier: &core.DataSource_InlineString{InlineString: usageSource}}},
	})
	if err != nil {
		return nil, fmt.Errorf("pack usage reader filter: %w", err)
	}
	return &hcm.HttpFilter{Name: usageReaderFilter, Disabled: in.offUntilRouted(), ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: config}}, nil
}

// usageReaderOn turns the usage reader on for a route.
func usageReaderOn() *anypb.Any {
	return mustAny(&route.FilterConfig{Config: mustAny(&lua.LuaPerRoute{Override: &lua.LuaPerRoute_Name{Name: usageScript}})})
}

// answerReading is the route feature of endpoints that serve model
// traffic: their routes turn the answer reader on.
type answerReading struct{}

func (answerReading) name() string            { return "answer_reading" }
func (answerReading) uses(e ir.Endpoint) bool { return e.ReadsAnswers }
func (answerReading) forward(e ir.Endpoint, r *route.Route, _ routeSite) {
	if r.TypedPerFilterConfig == nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{}
	}
	r.TypedPerFilterConfig[usageReaderFilter] = usageReaderOn()
	if q := e.TokenQuota; q != nil && q.Weighted() {
		r.Metadata = tokenWeights(q)
	}
}

// tokenWeights are a weighted quota's weights in its routes' metadata,
// under the reader's name, where the reader finds them (Lua's
// metadata()).
func tokenWeights(q *ir.TokenQuota) *core.Metadata {
	weights, _ := structpb.NewStruct(map[string]any{"input": q.Input, "output": q.Output, "cached": q.Cached}) // numbers: no error
	return &core.Metadata{FilterMetadata: map[string]*structpb.Struct{usageReaderFilter: weights}}
}

// answerSignalsLog is the public and mesh listeners' access log of the
// answers the reader read (those with a time to first byte): the node's
// access log service, its agent's (wire.GenAICluster), which keeps them
// as GenAI signals. Entries are sent in batches, off the request's path;
// an agent that does not listen loses them, nothing else. Packed once,
// like accessLogs.
var answerSignalsLog = packAnswerSignalsLog()

func packAnswerSignalsLog() *accesslog.AccessLog {
	config, err := anypb.New(&grpcaccesslog.HttpGrpcAccessLogConfig{CommonConfig: &grpcaccesslog.CommonGrpcAccessLogConfig{
		LogName: wire.GenAILogName,
		GrpcService: &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
			EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: wire.GenAICluster}}},
		TransportApiVersion: core.ApiVersion_V3,
		BufferFlushInterval: durationpb.New(answerSignalsFlush),
	}})
	if err != nil {
		panic(err) // a static, valid message
	}
	read := &accesslog.AccessLogFilter{FilterSpecifier: &accesslog.AccessLogFilter_MetadataFilter{MetadataFilter: &accesslog.MetadataFilter{
		Matcher: &matcher.MetadataMatcher{Filter: wire.UsageMetadata,
			Path:  []*matcher.MetadataMatcher_PathSegment{{Segment: &matcher.MetadataMatcher_PathSegment_Key{Key: wire.UsageTTFTKey}}},
			Value: &matcher.ValueMatcher{MatchPattern: &matcher.ValueMatcher_PresentMatch{PresentMatch: true}}},
		MatchIfKeyNotFound: wrapperspb.Bool(false),
	}}}
	return &accesslog.AccessLog{Name: "envoy.access_loggers.http_grpc", Filter: read, ConfigType: &accesslog.AccessLog_TypedConfig{TypedConfig: config}}
}

// answerSignalsFlush is how often a node's Envoy sends its agent the
// entries it has.
const answerSignalsFlush = 250 * time.Millisecond

// answerSignals is the manager feature that logs the answers read: every
// node's public and mesh listeners (the calling side, where the endpoint,
// the backend and the whole wait are known).
type answerSignals struct{}

func (answerSignals) name() string             { return "answer_signals" }
func (answerSignals) uses(wire.ProxyNode) bool { return true }
func (answerSignals) manager(listener string, m *hcm.HttpConnectionManager) {
	if listener == wire.PublicListener || listener == wire.MeshListener {
		m.AccessLog = append(slices.Clip(m.AccessLog), answerSignalsLog)
	}
}

// genAICluster reaches the node's agent's access log service.
func genAICluster() *cluster.Cluster {
	return unixSocketCluster(wire.GenAICluster, wire.GenAISocket)
}

// genAITags are the span attributes of the answer read, on the calling
// node's spans.
func genAITags() []*tracingtype.CustomTag {
	tag := func(name, key string) *tracingtype.CustomTag {
		return &tracingtype.CustomTag{Tag: name, Type: &tracingtype.CustomTag_Metadata_{Metadata: &tracingtype.CustomTag_Metadata{
			Kind:        &metadatav3.MetadataKind{Kind: &metadatav3.MetadataKind_Request_{Request: &metadatav3.MetadataKind_Request{}}},
			MetadataKey: &metadatav3.MetadataKey{Key: wire.UsageMetadata, Path: []*metadatav3.MetadataKey_PathSegment{{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: key}}}},
		}}}
	}
	return []*tracingtype.CustomTag{tag(wire.TagGenAIModel, wire.UsageModelKey), tag(wire.TagGenAIInputTokens, wire.UsageInputTokensKey),
		tag(wire.TagGenAIOutputTokens, wire.UsageOutputTokensKey)}
}
