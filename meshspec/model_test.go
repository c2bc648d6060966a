package meshspec

import (
	"encoding/json"
	"flag"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

func sample() *Model {
	return &Model{
		Backends: []Backend{
			{Name: "v1", Replicas: []Replica{{Address: "127.0.0.1:9001"}}, Config: BackendConfig{MaxConcurrentQueries: 4}},
			{Name: "v2", Replicas: []Replica{{Address: "[::1]:9002", Health: HealthDraining}}},
		},
		Endpoints: []Endpoint{
			{Name: "api", Route: "/api", Methods: []string{"post", "GET", "GET"}, Traffic: map[string]float64{"v1": 0.9, "v2": 0.1}, Shadows: map[string]float64{"v2": 0.2}},
			{Name: "inner", Traffic: map[string]float64{"v2": 1}},
		},
	}
}

func TestAllowedMethods(t *testing.T) {
	m := sample()
	if got := m.Endpoints[0].AllowedMethods(); !reflect.DeepEqual(got, []string{"GET", "POST"}) {
		t.Fatalf("AllowedMethods = %v, want [GET POST]", got)
	}
	if got := m.Endpoints[1].AllowedMethods(); !reflect.DeepEqual(got, []string{"GET"}) {
		t.Fatalf("default methods = %v, want [GET]", got)
	}
	if !m.Endpoints[1].Headless() || m.Endpoints[0].Headless() {
		t.Fatal("Headless is wrong")
	}
}

func TestMarshalParseRoundTrip(t *testing.T) {
	m := sample()
	out, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatalf("parse %s: %v", out, err)
	}
	if !reflect.DeepEqual(back, m) {
		t.Fatalf("round trip changed the model:\n%s\n%+v", out, back)
	}
}

func TestValidateDoesNotModify(t *testing.T) {
	m := sample()
	m.Endpoints[0].Traffic["v1"] = 0.3 // invalid sum
	before, _ := Marshal(m)
	if err := m.Validate(); err == nil {
		t.Fatal("invalid model validated")
	}
	after, _ := Marshal(m)
	if string(before) != string(after) {
		t.Fatal("Validate modified the model")
	}
}

func TestWeightToleranceBoundary(t *testing.T) {
	for _, tc := range []struct {
		delta float64
		ok    bool
	}{{0, true}, {5e-9, true}, {-5e-9, true}, {2e-8, false}, {-2e-8, false}} {
		m := sample()
		m.Endpoints[0].Traffic = map[string]float64{"v1": 0.5 + tc.delta, "v2": 0.5}
		if err := m.Validate(); (err == nil) != tc.ok {
			t.Errorf("weights off by %g: err %v, want ok=%v", tc.delta, err, tc.ok)
		}
	}
}

func TestNonFiniteNumbersAreRefused(t *testing.T) {
	m := sample()
	m.Endpoints[0].Traffic = map[string]float64{"v1": math.NaN(), "v2": 1}
	m.Endpoints[0].Shadows = map[string]float64{"v1": math.Inf(1)}
	err := m.Validate()
	if err == nil || !strings.Contains(err.Error(), "not a number") || !strings.Contains(err.Error(), "outside [0, 1]") {
		t.Fatalf("got %v, want both non-finite values reported", err)
	}
}

func TestEmptyInputIsNotAnEmptyModel(t *testing.T) {
	for _, in := range []string{"", "  \n", "\n\n"} {
		if _, err := Parse([]byte(in)); err == nil || !strings.Contains(err.Error(), "write {}") {
			t.Fatalf("Parse(%q) = %v, want a refusal", in, err)
		}
	}
	if m, err := Parse([]byte("{}")); err != nil || len(m.Backends) != 0 {
		t.Fatalf("Parse({}) = %v, %v", m, err)
	}
}

var update = flag.Bool("update", false, "rewrite golden error texts in testdata/errors and delete stale ones")

// TestGoldenInvalid parses each model in testdata/invalid: every one must be
// refused, with the error text in testdata/errors.
func TestGoldenInvalid(t *testing.T) {
	testutil.GoldenCases(t, "testdata/invalid", "testdata/errors", *update, func(t *testing.T, input []byte) map[string][]byte {
		if _, err := Parse(input); err != nil {
			return map[string][]byte{"error.txt": []byte(err.Error() + "\n")}
		}
		t.Fatal("an invalid-model case was accepted")
		return nil
	})
}

// TestSpecHashIs128Bits: a 32-bit hash could be matched by brute force;
// placements stored with one still count as running the current spec.
func TestSpecHashIs128Bits(t *testing.T) {
	spec := &ProcessSpec{Command: "/srv/model"}
	h := SpecHash(spec)
	if len(h) != 32 {
		t.Fatalf("SpecHash = %q: %d hex digits, want 32 (128 bits)", h, len(h))
	}
	for _, tc := range []struct {
		stored string
		want   bool
	}{{h, true}, {"", true}, {h[:8], true}, {"00000000", h[:8] == "00000000"}, {h[:16], false}, {SpecHash(&ProcessSpec{Command: "/bin/sh"}), false}} {
		if got := (Placement{Spec: tc.stored}).Runs(h); got != tc.want {
			t.Errorf("Placement{Spec: %q}.Runs(%q) = %v, want %v", tc.stored, h, got, tc.want)
		}
	}
}

// TestAddressPolicy: addresses on the node itself, its link or a cloud
// metadata service are refused unless allowed, DNS names unless the
// operator allows the name, and each error names the setting that allows
// it. The names and addresses are issue 34's: each got past the check
// before.
func TestAddressPolicy(t *testing.T) {
	var deny AddressPolicy
	allow := AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Names: []string{"model.internal", ".svc.internal"}}
	for _, tc := range []struct {
		addr         string
		denied, both bool
		flag         string
	}{
		{"127.0.0.1:15000", true, false, AllowFlag},
		{"127.1.2.3:8500", true, false, AllowFlag},
		{"[::1]:9001", true, true, AllowFlag},
		{"[::ffff:127.0.0.1]:9001", true, false, AllowFlag},
		{"169.254.169.254:80", true, true, AllowFlag},
		{"[fd00:ec2::254]:80", true, true, AllowFlag},
		{"100.100.100.200:80", true, true, AllowFlag},
		{"168.63.129.16:80", true, true, AllowFlag},
		{"[64:ff9b::a9fe:a9fe]:80", true, true, AllowFlag}, // 169.254.169.254 through NAT64
		{"[fe80::1]:80", true, true, AllowFlag},
		{"0.0.0.0:80", true, true, AllowFlag},
		{"[::]:80", true, true, AllowFlag},
		{"224.0.0.1:80", true, true, AllowFlag},
		{"10.0.0.5:9000", false, false, ""},
		{"[2001:db8::5]:9000", false, false, ""},
		{"localhost:8500", true, true, NameFlag},
		{"api.localhost.:8500", true, true, NameFlag},
		{"localhost4:8500", true, true, NameFlag},
		{"ip6-localhost:8500", true, true, NameFlag},
		{"metadata.google.internal:80", true, true, NameFlag},
		{"127.0.0.1.nip.io:8500", true, true, NameFlag},
		{"model.internal:9000", true, false, NameFlag},
		{"MODEL.internal.:9000", true, false, NameFlag},
		{"a.svc.internal:9000", true, false, NameFlag},
		{"svc.internal:9000", true, true, NameFlag},
		{"evilsvc.internal:9000", true, true, NameFlag},
	} {
		err := deny.Check(tc.addr)
		if (err != nil) != tc.denied {
			t.Errorf("Check(%q) = %v, want denied=%v", tc.addr, err, tc.denied)
		}
		if err != nil && !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("Check(%q): %v does not name %s", tc.addr, err, tc.flag)
		}
		if err := allow.Check(tc.addr); (err != nil) != tc.both {
			t.Errorf("with 127.0.0.0/8 and the names allowed, Check(%q) = %v, want denied=%v", tc.addr, err, tc.both)
		}
	}
	if err := deny.CheckIP(netip.MustParseAddr("127.0.0.1")); err == nil {
		t.Error("CheckIP accepted loopback")
	}
	if _, err := ParseCIDRs([]string{"127.0.0.1"}); err == nil || !strings.Contains(err.Error(), AllowFlag) {
		t.Errorf("a CIDR without its length: %v", err)
	}
	for _, bad := range []string{"127.0.0.1", "a..b", "-a.b", "a_b.c", ""} {
		if _, err := ParseNames([]string{bad}); err == nil || !strings.Contains(err.Error(), NameFlag) {
			t.Errorf("ParseNames(%q): %v", bad, err)
		}
	}
	if got, err := ParseNames([]string{"Legacy.Internal.", ".svc.internal"}); err != nil || got[0] != "legacy.internal" || got[1] != ".svc.internal" {
		t.Errorf("ParseNames: %v %v", got, err)
	}
}

// TestValidateStoredPlacements: placements are the controller's, stored
// with the state; Validate still checks a stored state's.
func TestValidateStoredPlacements(t *testing.T) {
	m := &Model{Backends: []Backend{{Name: "placed", Replicas: []Replica{{Address: "10.0.0.1:9002"}},
		Placements: []Placement{{Tag: "placed#zzzzzz", Node: "", State: "sleeping"}}}}}
	err := m.Validate()
	for _, want := range []string{"are set on a backend without a process", `"placed#zzzzzz" is not a replica tag`, "node: is empty", `"sleeping" is not`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want it to mention %q", err, want)
		}
	}
}

// TestEqualityCoversEveryField: a change to any field of an endpoint or a
// backend makes it differ, so that a store diff never drops a change (a
// field added later and forgotten in EndpointsEqual or BackendsEqual
// fails here).
func TestEqualityCoversEveryField(t *testing.T) {
	base := Endpoint{Name: "e", Traffic: map[string]float64{"a": 1}}
	for _, change := range []func(*Endpoint){
		func(e *Endpoint) { e.Name = "f" },
		func(e *Endpoint) { e.Route = "/r" },
		func(e *Endpoint) { e.Methods = []string{"POST"} },
		func(e *Endpoint) { e.Traffic = map[string]float64{"b": 1} },
		func(e *Endpoint) { e.Shadows = map[string]float64{"b": 0.5} },
		func(e *Endpoint) { e.TimeoutS = 1 },
		func(e *Endpoint) { e.IdleTimeoutS = 1 },
		func(e *Endpoint) { e.PerTryTimeoutS = 1 },
		func(e *Endpoint) { e.Match = []RequestMatch{{Header: "x", Exact: "y", Backend: "a"}} },
		func(e *Endpoint) { e.Sticky = &StickyKey{Header: "x"} },
		func(e *Endpoint) { e.Retry = &RetryPolicy{Attempts: 2} },
		func(e *Endpoint) { e.Rollout = &Rollout{Candidate: "b"} },
		func(e *Endpoint) {
			e.ModelRouting = &ByModel{Models: map[string]TrafficPolicy{"m": {Traffic: map[string]float64{"a": 1}}}}
		},
		func(e *Endpoint) { e.Criticality = Sheddable },
		func(e *Endpoint) { e.Priority = 3 },
		func(e *Endpoint) { e.RateLimit = &RateLimit{Local: &LocalRateLimit{RequestsPerSecond: 5}} },
		func(e *Endpoint) { e.Tracing = &EndpointTracing{SamplingPercent: 100} },
	} {
		e := CloneEndpoint(base)
		change(&e)
		if EndpointsEqual(base, e) {
			t.Errorf("EndpointsEqual misses a change: %+v", e)
		}
	}
	if n := reflect.TypeFor[Endpoint]().NumField(); n != 17 {
		t.Errorf("Endpoint has %d fields; cover the new ones here and in EndpointsEqual", n)
	}
	b := Backend{Name: "b"}
	for _, change := range []func(*Backend){
		func(b *Backend) { b.Name = "c" },
		func(b *Backend) { b.Replicas = []Replica{{Address: "127.0.0.1:1"}} },
		func(b *Backend) { b.Config.MaxConcurrentQueries = 3 },
		func(b *Backend) { b.Config.Outlier = &OutlierDetection{Consecutive5xx: 3} },
		func(b *Backend) { b.Protocol = ProtocolGRPC },
		func(b *Backend) { b.Process = &ProcessSpec{Command: "/x"} },
		func(b *Backend) { b.External = &ExternalSpec{Service: "s"} },
		func(b *Backend) { b.Placements = []Placement{{Tag: "b#1"}} },
	} {
		c := b
		change(&c)
		if BackendsEqual(b, c) {
			t.Errorf("BackendsEqual misses a change: %+v", c)
		}
	}
	if n := reflect.TypeFor[Backend]().NumField(); n != 7 {
		t.Errorf("Backend has %d fields; cover the new ones here and in BackendsEqual", n)
	}
}

// TestServiceNamesAreReserved: no backend may be named as servemesh's own
// services and identities (ReservedPrefix), so none is one of them.
func TestServiceNamesAreReserved(t *testing.T) {
	for _, name := range []string{wire.ControllerService, wire.NodeService("n1"), wire.BackendService("b")} {
		if !strings.HasPrefix(name, ReservedPrefix) {
			t.Errorf("service %q is not under the reserved prefix %q: a backend could take its name", name, ReservedPrefix)
		}
	}
}

// TestUserConfig: any JSON value, in YAML or JSON, the same config however
// it is written; it needs a path to reach the replicas.
func TestUserConfig(t *testing.T) {
	parse := func(doc string) (*Spec, error) { return ParseSpec([]byte(doc)) }
	a, err := parse(`backends:
  - name: m
    process: {command: /bin/serve, reconfigure_path: /reconfigure}
    config: {user_config: {temperature: 0.5, stop: ["\n"], nested: {k: [1, 2]}}}
`)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parse(`{"backends": [{"name": "m", "process": {"command": "/bin/serve", "reconfigure_path": "/reconfigure"},
		"config": {"user_config": {"nested": {"k": [1,2]}, "stop": ["\n"], "temperature": 0.5}}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	ua, ub := a.Backends[0].Config.UserConfig, b.Backends[0].Config.UserConfig
	if ua.Version() == "" || ua.Version() != ub.Version() {
		t.Fatalf("the same config written two ways: %s (%s) and %s (%s)", ua, ua.Version(), ub, ub.Version())
	}
	_, err = parse(`backends:
  - name: m
    process: {command: /bin/serve}
    config: {user_config: {temperature: 0.5}}
`)
	if err == nil || !strings.Contains(err.Error(), "reconfigure_path") {
		t.Fatalf("user_config without a reconfigure path: %v", err)
	}
}

func TestUserConfigIsCanonical(t *testing.T) {
	var a, b UserConfig
	if err := json.Unmarshal([]byte(`{"b": 1.50, "a": [true, {"y": 1, "x": 2}]}`), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{ "a":[true,{"x":2,"y":1}], "b":1.50 }`), &b); err != nil {
		t.Fatal(err)
	}
	if string(a) != `{"a":[true,{"x":2,"y":1}],"b":1.50}` || a.Version() != b.Version() {
		t.Fatalf("%s (%s) and %s (%s); want one canonical form", a, a.Version(), b, b.Version())
	}
}

// TestViewOfAProcessBackendIsValid: the data plane's view lists a process
// backend's replicas as a backend of listed replicas; every field that
// only a process backend may set must then be dropped, or the whole view
// is refused (user_config once was).
func TestViewOfAProcessBackendIsValid(t *testing.T) {
	b := Backend{Name: "m", Process: &ProcessSpec{Command: "/bin/serve", ReconfigurePath: "/reconfigure"},
		Config: BackendConfig{NumReplicas: 2, CPUs: 1, MemoryMB: 512, Resources: map[string]int{"gpu": 1},
			UserConfig: UserConfig(`{"t":1}`), HoldTimeoutS: 5, MaxHeld: 10, MaxConcurrentQueries: 4}}
	if err := (&Model{Backends: []Backend{b}}).Validate(); err != nil {
		t.Fatal(err)
	}
	b.Process, b.Replicas = nil, []Replica{{Address: "10.0.0.1:9000"}}
	b = b.WithoutProcessOnlyFields()
	if err := (&Model{Backends: []Backend{b}}).Validate(); err != nil {
		t.Fatalf("the view of a process backend: %v", err)
	}
}

// TestConfigsEqualCoversEveryField: configsEqual, which spares the
// translator reflection, tells configs apart in every field as
// reflect.DeepEqual does.
func TestConfigsEqualCoversEveryField(t *testing.T) {
	base := BackendConfig{}
	set := map[string]func(c *BackendConfig){
		"MaxConcurrentQueries":     func(c *BackendConfig) { c.MaxConcurrentQueries = 1 },
		"NumReplicas":              func(c *BackendConfig) { c.NumReplicas = 1 },
		"CPUs":                     func(c *BackendConfig) { c.CPUs = 1 },
		"MemoryMB":                 func(c *BackendConfig) { c.MemoryMB = 1 },
		"Resources":                func(c *BackendConfig) { c.Resources = map[string]int{} },
		"Outlier":                  func(c *BackendConfig) { c.Outlier = &OutlierDetection{} },
		"UserConfig":               func(c *BackendConfig) { c.UserConfig = UserConfig("1") },
		"HoldTimeoutS":             func(c *BackendConfig) { c.HoldTimeoutS = 1 },
		"GracefulShutdownTimeoutS": func(c *BackendConfig) { c.GracefulShutdownTimeoutS = 1 },
		"MaxHeld":                  func(c *BackendConfig) { c.MaxHeld = 1 },
		"FirstByteTimeoutS":        func(c *BackendConfig) { c.FirstByteTimeoutS = 1 },
		"Autoscaling":              func(c *BackendConfig) { c.Autoscaling = &AutoscalingConfig{} },
		"LoadAware":                func(c *BackendConfig) { c.LoadAware = &LoadAware{} },
		"EndpointPicker":           func(c *BackendConfig) { c.EndpointPicker = &EndpointPicker{} },
	}
	typ := reflect.TypeFor[BackendConfig]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		change, ok := set[name]
		if !ok {
			t.Errorf("BackendConfig.%s is new: compare it in configsEqual and change it here", name)
			continue
		}
		c := base
		change(&c)
		if configsEqual(base, c) || configsEqual(c, base) || !configsEqual(c, c) || reflect.DeepEqual(base, c) {
			t.Errorf("configsEqual misses a change of %s", name)
		}
	}
}

// TestAutoscaledBackendMayLeaveNumReplicasOut: a file's autoscaled backend
// without num_replicas starts at initial_replicas, else min_replicas, as
// the refusal of one outside the bounds says (a file so written was
// refused: 0 is outside autoscaling's [2, 5]).
func TestAutoscaledBackendMayLeaveNumReplicasOut(t *testing.T) {
	for doc, want := range map[string]int{
		"backends:\n- name: a\n  process: {command: /bin/serve}\n  config: {autoscaling: {min_replicas: 2, max_replicas: 5, target_in_flight_requests: 2}}\n":                      2,
		"backends:\n- name: a\n  process: {command: /bin/serve}\n  config: {autoscaling: {min_replicas: 0, initial_replicas: 3, max_replicas: 5, target_in_flight_requests: 2}}\n": 3,
	} {
		s, err := ParseSpec([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if got := s.Model().Backends[0].Config.NumReplicas; got != want {
			t.Errorf("%s: starts at %d replicas; want %d", doc, got, want)
		}
	}
}
