package meshspec

import (
	"reflect"
	"strings"
	"testing"
)

func inferenceModel() *Model {
	proc := &ProcessSpec{Command: "/opt/model/serve"}
	return &Model{
		Backends: []Backend{
			{Name: "llama-a", Process: proc, Config: BackendConfig{LoadAware: &LoadAware{}}},
			{Name: "llama-b", Process: proc},
			{Name: "mistral", Process: proc},
		},
		Endpoints: []Endpoint{{Name: "chat", Route: "/v1", Methods: []string{"POST"}, Criticality: Sheddable,
			ModelRouting: &ByModel{Models: map[string]TrafficPolicy{
				"llama-3-8b": {Traffic: map[string]float64{"llama-a": 0.75, "llama-b": 0.25}, Shadows: map[string]float64{"mistral": 0.5}},
				"mistral-7b": {Traffic: map[string]float64{"mistral": 1}, Rewrite: map[string]float64{"mistral-7b": 0.9, "mistral-7b-lora-b": 0.1}},
			}}}},
	}
}

func TestInferenceSettingsValidate(t *testing.T) {
	m := inferenceModel()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := m.Endpoints[0].UsedBackends(); len(got) != 3 {
		t.Errorf("used backends %v, want the three the models name", got)
	}
	c := Clone(m)
	c.Endpoints[0].ModelRouting.Models["llama-3-8b"].Traffic["llama-a"] = 0.5
	if m.Endpoints[0].ModelRouting.Models["llama-3-8b"].Traffic["llama-a"] != 0.75 {
		t.Error("Clone shares the models' traffic")
	}
	if EndpointsEqual(m.Endpoints[0], c.Endpoints[0]) {
		t.Error("EndpointsEqual misses a model's weight")
	}
	c = Clone(m)
	c.Endpoints[0].ModelRouting.Models["mistral-7b"].Rewrite["mistral-7b"] = 0.5
	if m.Endpoints[0].ModelRouting.Models["mistral-7b"].Rewrite["mistral-7b"] != 0.9 || EndpointsEqual(m.Endpoints[0], c.Endpoints[0]) {
		t.Error("Clone shares a model's rewrite, or EndpointsEqual misses it")
	}
}

// TestBadInferenceSettingsNameTheField: each bad setting is refused with
// its field and what to write.
func TestBadInferenceSettingsNameTheField(t *testing.T) {
	cases := map[string]struct {
		change func(m *Model)
		field  string
	}{
		"load_aware without a process": {func(m *Model) {
			m.Backends[0].Process, m.Backends[0].Replicas = nil, []Replica{{Address: "10.0.0.1:80"}}
		}, "backend \"llama-a\".config.load_aware: needs replicas servemesh's agents run"},
		"load_aware on an external service": {func(m *Model) {
			m.Backends[0].Process, m.Backends[0].External = nil, &ExternalSpec{Service: "legacy-llm"}
		}, "backend \"llama-a\".config.load_aware: needs replicas servemesh's agents run"},
		"a metric without a path": {func(m *Model) { m.Backends[0].Config.LoadAware.QueueMetric = "vllm:num_requests_waiting" },
			"load_aware.queue_metric: is read from the replicas' metrics: set metrics_path"},
		"a metric name": {func(m *Model) {
			m.Backends[0].Config.LoadAware = &LoadAware{MetricsPath: "/metrics", KVCacheMetric: "gpu cache"}
		}, "load_aware.kv_cache_metric: \"gpu cache\" is not a Prometheus metric name"},
		"a KV-cache limit": {func(m *Model) { m.Backends[0].Config.LoadAware.KVCacheLimit = 2 }, "load_aware.kv_cache_limit: is 2"},
		"a prefix cache too large": {func(m *Model) { m.Backends[0].Config.LoadAware.PrefixCacheTokens = PrefixCacheTokensLimit + 1 },
			"load_aware.prefix_cache_tokens: is 4194305; set the tokens one replica's prefix (KV) cache holds, from 1 to 4194304"},
		"a negative prefix cache": {func(m *Model) { m.Backends[0].Config.LoadAware.PrefixCacheTokens = -1 }, "load_aware.prefix_cache_tokens: is -1"},
		"a TTFT budget over ten minutes": {func(m *Model) { m.Backends[0].Config.LoadAware.TTFTBudgetMs = MaxTTFTBudgetMs + 1 },
			"load_aware.ttft_budget_ms: is 600001; set the prefill a replica may have queued and keep a prompt's affinity, in milliseconds from 1 to 600000"},
		"a negative TTFT budget":                   {func(m *Model) { m.Backends[0].Config.LoadAware.TTFTBudgetMs = -1 }, "load_aware.ttft_budget_ms: is -1"},
		"a criticality":                            {func(m *Model) { m.Endpoints[0].Criticality = "urgent" }, "criticality: \"urgent\" is not a criticality"},
		"a priority out of range":                  {func(m *Model) { m.Endpoints[0].Priority = -1001 }, "endpoint \"chat\".priority: is -1001; set an integer from -1000 to 1000"},
		"a priority above a sheddable criticality": {func(m *Model) { m.Endpoints[0].Priority = 2 }, "priority: is 2, but criticality is sheddable"},
		"a sheddable priority of a critical endpoint": {func(m *Model) { m.Endpoints[0].Criticality, m.Endpoints[0].Priority = Critical, -2 },
			"priority: is -2, which is sheddable, but criticality is critical"},
		"a tenant header": {func(m *Model) { m.Backends[0].Config.LoadAware.TenantHeader = "X-Tenant" }, "load_aware.tenant_header: \"X-Tenant\" is not a header"},
		"a queue bound":   {func(m *Model) { m.Backends[0].Config.LoadAware.MaxQueued = -1 }, "load_aware.max_queued: is -1; set how many requests may wait on a node, from 1 to 100000"},
		"a queue timeout": {func(m *Model) { m.Backends[0].Config.LoadAware.QueueTimeoutS = 61 }, "load_aware.queue_timeout_s: is 61; set how long a request may wait for a replica, up to 60 seconds"},
		"a scorer's weight": {func(m *Model) { m.Backends[0].Config.LoadAware.Weights = map[string]float64{"prefix": 11} },
			"load_aware.weights.prefix: is 11; set a weight from 0 (left out) to 10"},
		"an unknown scorer": {func(m *Model) { m.Backends[0].Config.LoadAware.Weights = map[string]float64{"latency": 1} },
			"load_aware.weights: \"latency\" is not a scorer of the picker; weigh queue, ttfb, kv_cache, prefix, model"},
		"a first-byte timeout": {func(m *Model) { m.Backends[0].Config.FirstByteTimeoutS = -1 },
			"config.first_byte_timeout_s: is -1; set the seconds one try may wait for its answer to start before it is tried on another replica, up to 3600, or 0 for no bound"},
		"traffic beside models": {func(m *Model) { m.Endpoints[0].Traffic = map[string]float64{"llama-a": 1} },
			"endpoint \"chat\".model_routing: splits by model"},
		"a model's weights": {func(m *Model) { m.Endpoints[0].ModelRouting.Models["mistral-7b"].Traffic["mistral"] = 0.5 },
			"model_routing.models.mistral-7b.traffic: weights sum to 0.5"},
		"a model's unknown backend": {func(m *Model) {
			m.Endpoints[0].ModelRouting.Models["x"] = TrafficPolicy{Traffic: map[string]float64{"nope": 1}}
		}, "model_routing.models.x.traffic.nope: backend \"nope\" is not defined"},
		"a rewrite's weights": {func(m *Model) { m.Endpoints[0].ModelRouting.Models["mistral-7b"].Rewrite["mistral-7b"] = 0.5 },
			"model_routing.models.mistral-7b.rewrite: weights sum to 0.6; they must sum to 1"},
		"a rewrite's name": {func(m *Model) { m.Endpoints[0].ModelRouting.Models["mistral-7b"].Rewrite[""] = 0 },
			"model_routing.models.mistral-7b.rewrite: \"\" is not a model name"},
		"a rewrite's negative weight": {func(m *Model) { m.Endpoints[0].ModelRouting.Models["mistral-7b"].Rewrite["x"] = -1 },
			"model_routing.models.mistral-7b.rewrite.x: weight -1 is negative"},
		"no models":   {func(m *Model) { m.Endpoints[0].ModelRouting.Models = nil }, "model_routing.models: is empty"},
		"a bad field": {func(m *Model) { m.Endpoints[0].ModelRouting.Field = "a b" }, "model_routing.field: \"a b\" is not a JSON field name"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m := inferenceModel()
			c.change(m)
			err := m.Validate()
			if err == nil || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("got %v, want a problem with %q", err, c.field)
			}
		})
	}
}

// TestLoadAwarePatch: a merge patch {} turns load-aware picking on without
// metrics, an object merges into the setting (null clears one of its
// fields), and null or the previous release's {"off": true} turns it off.
func TestLoadAwarePatch(t *testing.T) {
	c := BackendConfig{}
	for _, step := range []struct {
		patch string
		want  *LoadAware
	}{
		{`{"load_aware": {}}`, &LoadAware{}},
		{`{"load_aware": {"metrics_path": "/metrics", "queue_metric": "q"}}`, &LoadAware{MetricsPath: "/metrics", QueueMetric: "q"}},
		{`{"load_aware": {"queue_metric": null}}`, &LoadAware{MetricsPath: "/metrics"}},
		{`{"load_aware": {"off": true}}`, nil},
		{`{"load_aware": {}}`, &LoadAware{}},
		{`{"load_aware": null}`, nil},
	} {
		p, err := ParseConfigPatch([]byte(step.patch))
		if err != nil {
			t.Fatalf("%s: %v", step.patch, err)
		}
		if c, err = p.Apply(c); err != nil {
			t.Fatalf("%s: %v", step.patch, err)
		}
		if (c.LoadAware == nil) != (step.want == nil) || c.LoadAware != nil && !reflect.DeepEqual(*c.LoadAware, *step.want) {
			t.Fatalf("after %s: %+v, want %+v", step.patch, c.LoadAware, step.want)
		}
	}
}

// TestPriorityFollowsCriticality: an endpoint's priority is its own, else
// critical 0 and sheddable -1; a negative one makes it sheddable.
func TestPriorityFollowsCriticality(t *testing.T) {
	for _, c := range []struct {
		e        Endpoint
		priority int
		crit     Criticality
	}{
		{Endpoint{}, 0, Critical},
		{Endpoint{Criticality: Sheddable}, -1, Sheddable},
		{Endpoint{Priority: 5}, 5, Critical},
		{Endpoint{Priority: -3}, -3, Sheddable},
		{Endpoint{Priority: -3, Criticality: Sheddable}, -3, Sheddable},
	} {
		if p, crit := c.e.EffectivePriority(), c.e.EffectiveCriticality(); p != c.priority || crit != c.crit {
			t.Errorf("%+v: priority %d, criticality %s; want %d, %s", c.e, p, crit, c.priority, c.crit)
		}
	}
}

// TestInitialReplicasWithinTheBounds: initial_replicas outside
// [min_replicas, max_replicas] is refused, naming the field.
func TestInitialReplicasWithinTheBounds(t *testing.T) {
	b := Backend{Name: "b", Process: &ProcessSpec{Command: "/bin/true"},
		Config: BackendConfig{NumReplicas: 1, Autoscaling: &AutoscalingConfig{MinReplicas: 1, MaxReplicas: 3, TargetInFlight: 2, InitialReplicas: 4}}}
	err := (&Model{Backends: []Backend{b}}).Validate()
	if err == nil || !strings.Contains(err.Error(), "autoscaling.initial_replicas: 4 is outside [min_replicas 1, max_replicas 3]") {
		t.Fatalf("initial_replicas 4 of [1, 3]: %v", err)
	}
	b.Config.Autoscaling.InitialReplicas = 3
	if err := (&Model{Backends: []Backend{b}}).Validate(); err != nil {
		t.Fatalf("initial_replicas 3 of [1, 3]: %v", err)
	}
}
