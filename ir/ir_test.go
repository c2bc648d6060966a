package ir

import (
	"reflect"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestEqualSeesEveryField: the builder reuses what it built for a backend
// or an endpoint that is Equal to the last one, so Equal must compare
// every field: each is set in turn, alone, and must make the two differ.
func TestEqualSeesEveryField(t *testing.T) {
	check := func(zero any, equal func(a, b any) bool) {
		typ := reflect.TypeOf(zero)
		for i := range typ.NumField() {
			changed := reflect.New(typ).Elem()
			setNonZero(t, changed.Field(i))
			if equal(zero, changed.Interface()) {
				t.Errorf("%s.Equal does not compare %s", typ.Name(), typ.Field(i).Name)
			}
		}
	}
	check(Backend{}, func(a, b any) bool { return a.(Backend).Equal(b.(Backend)) })
	check(Endpoint{}, func(a, b any) bool { return a.(Endpoint).Equal(b.(Endpoint)) })
}

// setNonZero gives v a value other than its zero value.
func setNonZero(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int:
		v.SetInt(1)
	case reflect.Float64:
		v.SetFloat(1)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		setNonZero(t, s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		val := reflect.New(v.Type().Elem()).Elem()
		setNonZero(t, val)
		m.SetMapIndex(reflect.ValueOf("k").Convert(v.Type().Key()), val)
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		setNonZero(t, p.Elem())
		v.Set(p)
	case reflect.Struct:
		setNonZero(t, v.Field(0))
	default:
		t.Fatalf("setNonZero: no case for %s", v.Kind())
	}
}

// TestLowerDecides: Lower decides what translation used to test itself:
// how nodes reach each backend, its effective limit, whether the picker
// fronts it (only where there is an inbound listener), each endpoint's
// methods and criticality.
func TestLowerDecides(t *testing.T) {
	view := &meshspec.Model{
		Backends: []meshspec.Backend{
			{Name: "plain", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9001"}}},
			{Name: "named", Replicas: []meshspec.Replica{{Address: "svc.internal:80"}}},
			{Name: "meshed", Config: meshspec.BackendConfig{MaxConcurrentQueries: 4, LoadAware: &meshspec.LoadAware{}},
				Replicas: []meshspec.Replica{{Address: "127.0.0.1:9002", Node: "n1", Inbound: "10.0.0.1:21000", Health: meshspec.HealthDraining}}},
			{Name: "aware-plain", Config: meshspec.BackendConfig{LoadAware: &meshspec.LoadAware{}}, Replicas: []meshspec.Replica{{Address: "127.0.0.1:9003", Node: "n1"}}},
			{Name: "empty"},
		},
		Endpoints: []meshspec.Endpoint{{Name: "e", Route: "/e", Methods: []string{"post", "GET", "get"}, Traffic: map[string]float64{"plain": 1}}},
	}
	for _, mtls := range []bool{false, true} {
		dp, err := Lower(view, nil, Options{MTLS: mtls})
		if err != nil {
			t.Fatal(err)
		}
		emptyReach := ReachAddress
		if mtls {
			emptyReach = ReachInbound
		}
		for name, want := range map[string]Backend{
			"plain":       {Reach: ReachAddress, MaxConcurrent: meshspec.DefaultMaxConcurrentQueries},
			"named":       {Reach: ReachDNS, MaxConcurrent: meshspec.DefaultMaxConcurrentQueries},
			"meshed":      {Reach: ReachInbound, MaxConcurrent: 4, Picked: true},
			"aware-plain": {Reach: ReachAddress, MaxConcurrent: meshspec.DefaultMaxConcurrentQueries},
			"empty":       {Reach: emptyReach, MaxConcurrent: meshspec.DefaultMaxConcurrentQueries},
		} {
			got, ok := dp.Backend(name)
			if !ok || got.Reach != want.Reach || got.MaxConcurrent != want.MaxConcurrent || got.Picked != want.Picked {
				t.Errorf("mtls=%v: %s lowered to %+v, want reach %s, max_concurrent %d, picked %v", mtls, name, got, want.Reach, want.MaxConcurrent, want.Picked)
			}
		}
		if m, _ := dp.Backend("meshed"); m.Replicas[0].Health != Draining || !m.Activated() || !m.ViaInbound() {
			t.Errorf("meshed: %+v", m)
		}
		if n, _ := dp.Backend("named"); n.Activated() {
			t.Error("a backend Envoy resolves by DNS is fronted by the activator")
		}
		if p, _ := dp.Backend("plain"); p.Replicas[0].Health != Healthy {
			t.Errorf("a replica of no stated health lowered to %q, want healthy", p.Replicas[0].Health)
		}
		e := dp.Endpoints[0]
		if strings.Join(e.Methods, ",") != "GET,POST" || e.Criticality != wire.Critical {
			t.Errorf("endpoint lowered to methods %v, criticality %q", e.Methods, e.Criticality)
		}
	}
}

// TestLowerTakesTheStateAndItsReplicas: Lower reads the stored state as
// it is (a process backend's spec and placements, which it does not
// serve, are left as they were) with each backend's replicas from the
// map, and refuses, naming the backend, replicas the IR cannot serve.
func TestLowerTakesTheStateAndItsReplicas(t *testing.T) {
	state := &meshspec.Model{Backends: []meshspec.Backend{
		{Name: "a", Process: &meshspec.ProcessSpec{Command: "/srv/a"}, Config: meshspec.BackendConfig{NumReplicas: 1},
			Placements: []meshspec.Placement{{Tag: "a#000001", Node: "n1", State: meshspec.Running}}},
		{Name: "s", Replicas: []meshspec.Replica{{Address: "127.0.0.1:2"}}},
	}, Endpoints: []meshspec.Endpoint{{Name: "e", Route: "/e", Traffic: map[string]float64{"a": 0.5, "s": 0.5}}}}
	if err := state.Validate(); err != nil {
		t.Fatal(err)
	}
	before := meshspec.Clone(state)
	dp, err := Lower(state, map[string][]meshspec.Replica{"a": {{Address: "127.0.0.1:1", Node: "n1", Inbound: "10.0.0.1:21000"}}}, Options{MTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := dp.Backend("a")
	s, _ := dp.Backend("s")
	if len(a.Replicas) != 1 || a.Replicas[0].Inbound != "10.0.0.1:21000" || len(s.Replicas) != 1 || s.Replicas[0].Address != "127.0.0.1:2" {
		t.Fatalf("lowered backends %+v and %+v; want a's replica from the map, s's own", a, s)
	}
	if !reflect.DeepEqual(state, before) {
		t.Fatal("Lower changed the state")
	}
	if dp, err := Lower(state, map[string][]meshspec.Replica{"a": {{Address: "not an address", Node: "n1", Inbound: "10.0.0.1:21000"}}}, Options{MTLS: true}); dp != nil || err == nil || !strings.Contains(err.Error(), `backend "a"`) {
		t.Fatalf("got %v, %v; want the IR's refusal naming backend a", dp, err)
	}
}

// TestValidateChecksWhatTranslationTrusts: an IR not made by Lower is
// checked for what translation relies on without checking again.
func TestValidateChecksWhatTranslationTrusts(t *testing.T) {
	good := func() *DataPlane {
		return &DataPlane{
			Backends: []Backend{
				{Name: "a", Reach: ReachInbound, MaxConcurrent: 1, Picked: true,
					Replicas: []Replica{{Address: "127.0.0.1:1", Health: Healthy, Node: "n1", Inbound: "10.0.0.1:21000"}}},
				{Name: "b", Reach: ReachDNS, MaxConcurrent: 1, Replicas: []Replica{{Address: "svc:80", Health: Unknown}}},
			},
			Endpoints: []Endpoint{{Name: "e", Methods: []string{"GET"}, Traffic: map[string]float64{"a": 1}, Shadows: map[string]float64{"b": 0.1}}},
		}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a good IR: %v", err)
	}
	for _, c := range []struct {
		name   string
		mutate func(*DataPlane)
		want   string
	}{
		{"unsorted", func(dp *DataPlane) { dp.Backends[0], dp.Backends[1] = dp.Backends[1], dp.Backends[0] }, "names must be unique and sorted"},
		{"reach", func(dp *DataPlane) { dp.Backends[0].Reach = "carrier pigeon" }, `reach "carrier pigeon"`},
		{"picked in plaintext", func(dp *DataPlane) { dp.Backends[0].Reach, dp.Backends[0].Replicas = ReachAddress, nil }, "turn load_aware off"},
		{"no limit", func(dp *DataPlane) { dp.Backends[1].MaxConcurrent = 0 }, "max_concurrent 0"},
		{"address", func(dp *DataPlane) { dp.Backends[0].Replicas[0].Address = "svc:80" }, "want IP:port"},
		{"inbound", func(dp *DataPlane) { dp.Backends[0].Replicas[0].Inbound = "" }, "inbound: want IP:port"},
		{"node", func(dp *DataPlane) { dp.Backends[0].Replicas[0].Node = "" }, "node: empty"},
		{"health", func(dp *DataPlane) { dp.Backends[1].Replicas[0].Health = "" }, `health ""`},
		{"missing backend", func(dp *DataPlane) { dp.Endpoints[0].Shadows = map[string]float64{"c": 1} }, `backend "c", which the data plane does not have`},
		{"no methods", func(dp *DataPlane) { dp.Endpoints[0].Methods = nil }, "methods: none allowed"},
		{"global limit unit", func(dp *DataPlane) { dp.Endpoints[0].GlobalRateLimit = &GlobalRateLimit{Requests: 5, Unit: "week"} }, `global rate limit: 5 a "week"`},
		{"token quota unit", func(dp *DataPlane) { dp.Endpoints[0].TokenQuota = &TokenQuota{Tokens: 5, Unit: "week"} }, `token quota: 5 a "week"`},
		{"global limit of none", func(dp *DataPlane) { dp.Endpoints[0].GlobalRateLimit = &GlobalRateLimit{Unit: "second"} }, `global rate limit: 0 a "second"`},
	} {
		dp := good()
		c.mutate(dp)
		if err := dp.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
