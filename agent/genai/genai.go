package genai

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"sort"
	"strings"
	"sync"

	accesslogdata "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslog "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/wire"
)

// MaxModels bounds the models a backend's signals are labelled with: the
// model an answer names is its replica's word, and a replica may be
// anyone's; the answers of further models count as OtherModel.
const MaxModels = 16

// OtherModel labels the answers of a backend's models past MaxModels, and
// NoModel those that named none.
const (
	OtherModel = "other"
	NoModel    = ""
)

// Answer is what the node's Envoy read of one answer.
type Answer struct {
	Endpoint, Backend, Model string
	// TTFTMs is the time to its first byte; InterTokenMs the mean time
	// between its tokens, negative when it did not stream two or more.
	TTFTMs, InterTokenMs float64
	Input, Output        uint64
	// Shadowed: the endpoint's token quota, in shadow mode, would have
	// refused the request (wire.ShadowedKey).
	Shadowed bool
}

// Recorder keeps the signals. Its zero value is not usable: call New.
type Recorder struct {
	log              *slog.Logger
	ttft, interToken *prometheus.HistogramVec
	tokens           *prometheus.CounterVec
	shadowed         *prometheus.CounterVec

	mu       sync.Mutex
	shadowBy map[string]uint64          // by endpoint
	loads    map[string]*counts         // by backend
	models   map[string]map[string]bool // by backend: the models it is labelled with
}

// counts are one backend's answers by bucket of wire.GenAIBoundsMs (the
// last one: beyond every bound).
type counts struct{ ttft, interToken []uint64 }

// New returns a Recorder whose metrics reg receives (nil: none).
func New(log *slog.Logger, reg prometheus.Registerer) *Recorder {
	labels := []string{"endpoint", "backend", "model"}
	r := &Recorder{log: log, loads: map[string]*counts{}, models: map[string]map[string]bool{}, shadowBy: map[string]uint64{},
		shadowed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "servemesh_token_quota_shadow_refusals_total",
			Help: "Requests an endpoint's token quota in shadow mode would have refused (it refuses none), as this node's rate limit service answered."},
			[]string{"endpoint"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "servemesh_genai_time_to_first_token_seconds",
			Help:    "Time from a request of model traffic to the first byte of its answer, as the calling node saw it (OpenTelemetry's gen_ai.server.time_to_first_token).",
			Buckets: []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}}, labels),
		interToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "servemesh_genai_time_per_output_token_seconds",
			Help:    "Mean time between the tokens of a streamed answer of model traffic, after its first (OpenTelemetry's gen_ai.server.time_per_output_token).",
			Buckets: []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}}, labels),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "servemesh_genai_tokens_total",
			Help: "Tokens of the answers of model traffic, as they stated them (type input or output; output counts events where an answer states none)."},
			append(labels, "type")),
	}
	if reg != nil {
		reg.MustRegister(r.ttft, r.interToken, r.tokens, r.shadowed)
	}
	return r
}

// Record keeps one answer.
func (r *Recorder) Record(a Answer) {
	r.mu.Lock()
	a.Model = r.modelLabel(a.Backend, a.Model)
	c := r.loads[a.Backend]
	if c == nil {
		c = &counts{ttft: make([]uint64, len(wire.GenAIBoundsMs)+1), interToken: make([]uint64, len(wire.GenAIBoundsMs)+1)}
		r.loads[a.Backend] = c
	}
	c.ttft[bucket(a.TTFTMs)]++
	if a.InterTokenMs >= 0 {
		c.interToken[bucket(a.InterTokenMs)]++
	}
	if a.Shadowed {
		r.shadowBy[a.Endpoint]++
	}
	r.mu.Unlock()
	if a.Shadowed {
		r.shadowed.WithLabelValues(a.Endpoint).Inc()
	}
	r.ttft.WithLabelValues(a.Endpoint, a.Backend, a.Model).Observe(a.TTFTMs / 1000)
	if a.InterTokenMs >= 0 {
		r.interToken.WithLabelValues(a.Endpoint, a.Backend, a.Model).Observe(a.InterTokenMs / 1000)
	}
	if a.Input > 0 {
		r.tokens.WithLabelValues(a.Endpoint, a.Backend, a.Model, "input").Add(float64(a.Input))
	}
	if a.Output > 0 {
		r.tokens.WithLabelValues(a.Endpoint, a.Backend, a.Model, "output").Add(float64(a.Output))
	}
}

// modelLabel is the label of model among backend's: itself while the
// backend has fewer than MaxModels, else OtherModel. Called with mu held.
func (r *Recorder) modelLabel(backend, model string) string {
	seen := r.models[backend]
	if seen == nil {
		seen = map[string]bool{}
		r.models[backend] = seen
	}
	if !seen[model] && len(seen) >= MaxModels {
		return OtherModel
	}
	seen[model] = true
	return model
}

// bucket is the index of the first bound at or above ms.
func bucket(ms float64) int {
	return sort.SearchFloat64s(wire.GenAIBoundsMs, ms)
}

// Loads are the backends' histograms, cumulative, for the node's Load.
func (r *Recorder) Loads() map[string]wire.GenAILoad {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]wire.GenAILoad, len(r.loads))
	for b, c := range r.loads {
		out[b] = wire.GenAILoad{TTFT: cumulative(c.ttft), InterToken: cumulative(c.interToken)}
	}
	return out
}

// Shadowed are the requests each endpoint's token quota in shadow mode
// would have refused, since the agent started.
func (r *Recorder) Shadowed() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.shadowBy)
}

// cumulative is counts by bucket as counts at or below each bound.
func cumulative(byBucket []uint64) []uint64 {
	out := make([]uint64, len(wire.GenAIBoundsMs))
	var sum uint64
	for i := range out {
		sum += byBucket[i]
		out[i] = sum
	}
	return out
}

// Serve is the node's access log service, on its socket in dir (the
// node's Envoy's folder), until ctx ends.
func (r *Recorder) Serve(ctx context.Context, dir string) error {
	l, path, err := envoy.ListenSocket(ctx, dir, wire.GenAISocket)
	if err != nil {
		return fmt.Errorf("genai: %w", err)
	}
	srv := grpc.NewServer()
	accesslog.RegisterAccessLogServiceServer(srv, r)
	r.log.Info("access log service serving: the node's GenAI signals are kept here", "socket", path)
	err = rungroup.ServeGRPC(ctx, srv, l)
	if err != nil {
		return fmt.Errorf("genai: %w", err)
	}
	return nil
}

// StreamAccessLogs records the answers of the entries the node's Envoy
// sends.
func (r *Recorder) StreamAccessLogs(stream accesslog.AccessLogService_StreamAccessLogsServer) error {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&accesslog.StreamAccessLogsResponse{})
		}
		if err != nil {
			return err
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			if a, ok := AnswerOf(e); ok {
				r.Record(a)
			}
		}
	}
}

// AnswerOf reads an entry of the node's Envoy: false unless its answer
// was read and reached a backend.
func AnswerOf(e *accesslogdata.HTTPAccessLogEntry) (Answer, bool) {
	common := e.GetCommonProperties()
	usage := common.GetMetadata().GetFilterMetadata()[wire.UsageMetadata].GetFields()
	ttft, ok := number(usage[wire.UsageTTFTKey])
	backend := common.GetUpstreamCluster()
	if !ok || ttft < 0 || backend == "" || strings.HasPrefix(backend, "_") {
		return Answer{}, false
	}
	endpoint, _, _ := strings.Cut(common.GetRouteName(), "/")
	a := Answer{Endpoint: endpoint, Backend: backend, Model: usage[wire.UsageModelKey].GetStringValue(), TTFTMs: ttft, InterTokenMs: -1}
	if v, ok := number(usage[wire.UsageInterTokenKey]); ok && v >= 0 {
		a.InterTokenMs = v
	}
	if v, ok := number(usage[wire.UsageInputTokensKey]); ok && v > 0 {
		a.Input = uint64(v)
	}
	if v, ok := number(usage[wire.UsageOutputTokensKey]); ok && v > 0 {
		a.Output = uint64(v)
	}
	a.Shadowed = len(common.GetMetadata().GetFilterMetadata()[wire.RateLimitFilterMetadata].GetFields()[wire.ShadowedKey].GetListValue().GetValues()) > 0
	return a, true
}

// number reads a metadata value the reader set: a number (or a string of
// one, as Lua may hand it over).
func number(v *structpb.Value) (float64, bool) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		return k.NumberValue, !math.IsNaN(k.NumberValue) && !math.IsInf(k.NumberValue, 0)
	case *structpb.Value_StringValue:
		var f float64
		_, err := fmt.Sscan(k.StringValue, &f)
		return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	return 0, false
}
