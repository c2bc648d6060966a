package demoreplica

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	orcav3 "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/wire"
)

// ModelServer is a stand-in for a model server (vLLM) in tests, demos and
// benchmarks: it runs at most Slots requests at a time, each taking
// Service × Slowdown × (1 + running/Slots) (a batch slows as it grows), and
// queues the rest; it serves vLLM's load gauges at /metrics and answers
// OpenAI-style requests with the model the body names.
type ModelServer struct {
	Backend, Name string
	Slots         int
	Service       time.Duration
	Slowdown      float64 // 1: normal; 3: three times slower
	// FakeWaiting is added to the queue it reports (a server whose gauges
	// say it is busier than it is); Odd marks the replica that is slower
	// or fakes its queue, in its answers.
	FakeWaiting int
	Odd         bool
	// ForgeReport makes it send ORCA load reports of its own (text and
	// binary) claiming a huge capacity: a compromised replica steering its
	// backend's traffic, which the inbound hop must strip.
	ForgeReport bool
	// CacheBlocks, if positive, gives it a prefix cache of that many
	// blocks of prompts (prefix.Blocks, least recently used dropped first,
	// as vLLM's automatic prefix caching keeps KV blocks): each block of a
	// prompt not in it adds PrefillPerBlock to the answer's time, a cached
	// one a twentieth of that.
	CacheBlocks     int
	PrefillPerBlock time.Duration
	// ModelsPerReplica, if positive, has it load models on demand, at most
	// that many at once (least recently used dropped first, as Ray Serve's
	// multiplexing does): a request for a model it has not loaded waits
	// ModelLoad first. The model is the serve_multiplexed_model_id header,
	// else the body's "model".
	ModelsPerReplica int
	ModelLoad        time.Duration
	// Hang makes it accept every POST and never answer it, until the
	// client goes (a stalled engine); GETs are answered.
	Hang bool
	// TokenInterval is the time between two tokens of a streamed answer.
	TokenInterval time.Duration

	mu               sync.Mutex
	running, waiting int
	free             *sync.Cond
	served           int
	cache            *prefix.Index
	queries, hits    int      // prompt blocks looked up in the cache, and found
	loaded           []string // models loaded, most recent first
	loads            int      // models loaded so far
}

// ModelAnswer is a ModelServer's answer.
type ModelAnswer struct {
	// ID, Object, Created, Choices and Usage are OpenAI's (openai.go).
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`

	Backend string `json:"backend"`
	Replica string `json:"replica"`
	Model   string `json:"model"`
	Slow    bool   `json:"slow"`
	Odd     bool   `json:"odd"`
	Shadow  string `json:"shadow,omitempty"`
	Queued  int    `json:"queued"` // requests waiting when it arrived
	// Blocks are the prompt's whole blocks and Cached those its prefix
	// cache held (with CacheBlocks).
	Blocks int `json:"blocks,omitempty"`
	Cached int `json:"cached,omitempty"`
	// LoadedModel: it loaded the request's model for it (with
	// ModelsPerReplica).
	LoadedModel bool `json:"loaded_model,omitempty"`
}

// maxModelRequest bounds a request body the model server reads.
const maxModelRequest = 1 << 20

func (s *ModelServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch req.URL.Path {
	case "/metrics":
		s.metrics(w)
		return
	case "/health":
		w.WriteHeader(http.StatusOK)
		return
	}
	if s.Hang && req.Method == http.MethodPost {
		<-req.Context().Done()
		return
	}
	var body chatRequest
	raw, err := io.ReadAll(io.LimitReader(req.Body, maxModelRequest))
	if err == nil && len(raw) > 0 {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		http.Error(w, "not a JSON body: "+err.Error(), http.StatusBadRequest)
		return
	}
	queued, ok := s.admit(req)
	if !ok {
		return // the client left
	}
	blocks, cached := s.lookUp(raw)
	loaded := s.load(cmp.Or(req.Header.Get("serve_multiplexed_model_id"), body.Model))
	if loaded {
		select {
		case <-time.After(s.ModelLoad):
		case <-req.Context().Done():
			s.release()
			return
		}
	}
	took := s.work(req, len(blocks)-cached, cached)
	s.release()
	if !took {
		return
	}
	w.Header().Set(BackendHeader, s.Backend)
	w.Header().Set(ReplicaHeader, s.Name)
	if s.ForgeReport {
		forgeReport(w.Header())
	}
	a := ModelAnswer{Backend: s.Backend, Replica: s.Name, Model: body.Model, Slow: s.Slowdown > 1, Odd: s.Odd,
		Shadow: req.Header.Get(wire.ShadowHeader), Queued: queued, Blocks: len(blocks), Cached: cached, LoadedModel: loaded}
	usage := usageOf(body, raw)
	if body.Stream {
		streamAnswer(w, a, body, usage, s.TokenInterval)
		return
	}
	openAIAnswer(&a, usage)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(a)
}

// load makes model one of the models it holds, and reports whether it
// had to load it.
func (s *ModelServer) load(model string) bool {
	if s.ModelsPerReplica <= 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.loaded, model); i >= 0 {
		s.loaded = slices.Insert(slices.Delete(s.loaded, i, i+1), 0, model)
		return false
	}
	s.loaded = slices.Insert(s.loaded, 0, model)
	s.loaded = s.loaded[:min(len(s.loaded), s.ModelsPerReplica)]
	s.loads++
	return true
}

// lookUp is the prompt's blocks and how many, from the first, its prefix
// cache held; the prompt is cached from then on.
func (s *ModelServer) lookUp(body []byte) ([]uint64, int) {
	if s.CacheBlocks <= 0 {
		return nil, 0
	}
	blocks := prefix.Blocks(body, prefix.BlockBytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		s.cache = prefix.NewIndex(s.CacheBlocks)
	}
	cached := s.cache.Match(blocks)
	s.cache.Add(blocks)
	s.queries += len(blocks)
	s.hits += cached
	return blocks, cached
}

// admit waits for a free slot: how many requests were waiting before it,
// and false if the client left first.
func (s *ModelServer) admit(req *http.Request) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free == nil {
		s.free = sync.NewCond(&s.mu)
	}
	queued := s.waiting
	s.waiting++
	stop := wakeWhenGone(req, s.free)
	defer stop()
	for s.running >= max(s.Slots, 1) {
		if req.Context().Err() != nil {
			s.waiting--
			return queued, false
		}
		s.free.Wait()
	}
	s.waiting--
	s.running++
	return queued, true
}

// work takes the request's time, which grows with the running batch,
// and its prefill's: its prompt's blocks, uncached ones at full cost.
func (s *ModelServer) work(req *http.Request, uncached, cached int) bool {
	s.mu.Lock()
	d := time.Duration(float64(s.Service) * max(s.Slowdown, 1) * (1 + float64(s.running)/float64(max(s.Slots, 1))))
	s.mu.Unlock()
	d += time.Duration(uncached)*s.PrefillPerBlock + time.Duration(cached)*s.PrefillPerBlock/20
	select {
	case <-time.After(d):
		return true
	case <-req.Context().Done():
		return false
	}
}

func (s *ModelServer) release() {
	s.mu.Lock()
	s.running--
	s.served++
	s.mu.Unlock()
	s.free.Broadcast()
}

// wakeWhenGone wakes the waiters when req's client leaves, until stop.
func wakeWhenGone(req *http.Request, c *sync.Cond) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-req.Context().Done():
			c.L.Lock()
			c.Broadcast()
			c.L.Unlock()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// metrics are vLLM's load gauges (its names), the KV cache filling with
// the requests it holds.
func (s *ModelServer) metrics(w http.ResponseWriter) {
	s.mu.Lock()
	running, waiting := s.running, s.waiting+s.FakeWaiting
	queries, hits, loads := s.queries, s.hits, s.loads
	loaded := strings.Join(s.loaded, ",")
	s.mu.Unlock()
	kv := min(float64(running+waiting)/float64(4*max(s.Slots, 1)), 1)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=%q} %d\n", s.Backend, running)
	fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=%q} %d\n", s.Backend, waiting)
	// vLLM's current name: it no longer exports vllm:gpu_cache_usage_perc.
	fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=%q} %g\n", s.Backend, kv)
	// Its prefix cache, as vLLM counts it (in blocks here, tokens there),
	// and its block size in tokens (prefix.BlockBytes at ~4 bytes a token).
	fmt.Fprintf(w, "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=%q} %d\n", s.Backend, queries)
	fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name=%q} %d\n", s.Backend, hits)
	fmt.Fprintf(w, "# TYPE servemesh_demo_model_loads counter\nservemesh_demo_model_loads_total %d\n", loads)
	fmt.Fprintf(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\"} 1\n", prefix.BlockBytes/4)
	if s.ModelsPerReplica > 0 {
		// vLLM's adapters, as a series whose value is when it was read;
		// the stand-in names every model it holds as running.
		fmt.Fprintf(w, "# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"%d\",running_lora_adapters=%q,waiting_lora_adapters=\"\"} %d\n",
			s.ModelsPerReplica, loaded, time.Now().Unix())
	}
}

// forgeReport sets ORCA reports claiming a million requests a second at no
// utilization, in both of the forms Envoy reads.
func forgeReport(h http.Header) {
	report, _ := proto.Marshal(&orcav3.OrcaLoadReport{RpsFractional: 1e6, ApplicationUtilization: 1e-6})
	h.Set(wire.LoadReportBinHeader, base64.StdEncoding.EncodeToString(report))
	h.Set(wire.LoadReportHeader, "TEXT application_utilization=0.000001,rps_fractional=1000000")
}
