package meshspec

import (
	stdjson "encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestMergePatchRFC7386: the examples of RFC 7386's appendix A.
func TestMergePatchRFC7386(t *testing.T) {
	for _, c := range [][3]string{
		{`{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
		{`{"a":"b"}`, `{"a":null}`, `{}`},
		{`{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
		{`{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
		{`{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
		{`["a","b"]`, `["c","d"]`, `["c","d"]`},
		{`{"a":"b"}`, `["c"]`, `["c"]`},
		{`{"a":"foo"}`, `null`, `null`},
		{`{"a":"foo"}`, `"bar"`, `"bar"`},
		{`{"e":null}`, `{"a":1}`, `{"a":1,"e":null}`},
		{`[1,2]`, `{"a":"b","c":null}`, `{"a":"b"}`},
		{`{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
	} {
		var target, patch, want any
		for i, v := range []*any{&target, &patch, &want} {
			if err := stdjson.Unmarshal([]byte(c[i]), v); err != nil {
				t.Fatal(err)
			}
		}
		got := MergePatch(target, patch)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("MergePatch(%s, %s) = %v, want %s", c[0], c[1], got, c[2])
		}
	}
}

// TestConfigPatchRefusesWhatItCannotApply: every refusal names the field
// or says what to send, and an unknown field is refused before any state
// is read.
func TestConfigPatchRefusesWhatItCannotApply(t *testing.T) {
	for body, want := range map[string]string{
		`[1]`:                                    "must be",
		`null`:                                   "the patch is null",
		`{}`:                                     "sets no field",
		`{"num_replica": 3}`:                     `unknown field "/num_replica"`,
		`{"autoscaling": {"max": 3}}`:            `unknown field "/autoscaling/max"`,
		`{"replicas": null}`:                     `field "replicas"`,
		`{"num_replicas": 3, "num_replicas": 4}`: "duplicate",
	} {
		if _, err := ParseConfigPatch([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseConfigPatch(%s): %v, want an error with %q", body, err, want)
		}
	}
	p, err := ParseConfigPatch([]byte(`{"max_concurrent_queries": "ten"}`))
	if err == nil {
		_, err = p.Apply(BackendConfig{})
	}
	if err == nil || !strings.Contains(err.Error(), "max_concurrent_queries") {
		t.Errorf("a string where a number goes: %v", err)
	}
}

// TestConfigPatchReadsThePreviousReleasesBodies: the removal conventions
// of the hand-written patch (an empty autoscaling config, {"off": true},
// resources {}) still remove, as null does; objects merge.
func TestConfigPatchReadsThePreviousReleasesBodies(t *testing.T) {
	c := BackendConfig{NumReplicas: 2, Resources: map[string]int{"gpu": 1}, LoadAware: &LoadAware{MetricsPath: "/metrics"},
		Autoscaling: &AutoscalingConfig{MinReplicas: 1, MaxReplicas: 4, TargetInFlight: 2, UpscaleDelayS: 5}}
	for _, body := range []string{`{"autoscaling": {"max_replicas": 0}}`, `{"autoscaling": {"min_replicas": 0, "max_replicas": 0, "target_in_flight_requests": 0}}`,
		`{"load_aware": {"off": true}}`, `{"resources": {}}`} {
		p, err := ParseConfigPatch([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if c, err = p.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if c.Autoscaling != nil || c.LoadAware != nil || c.Resources != nil || c.NumReplicas != 2 {
		t.Fatalf("after the removals: %+v", c)
	}
	on, err := ParseConfigPatch([]byte(`{"load_aware": {"off": false, "metrics_path": "/m"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c, err = on.Apply(c); err != nil || c.LoadAware == nil || c.LoadAware.MetricsPath != "/m" {
		t.Fatalf(`{"off": false, ...}: %+v, %v`, c.LoadAware, err)
	}
	n := 0
	typed, err := BackendConfigPatch{Resources: map[string]int{}, NumReplicas: &n}.MergePatch()
	if err != nil || !typed.Sets("resources") || !typed.Sets("num_replicas") {
		t.Fatalf("the typed patch's resources {}: %+v, %v", typed.Fields(), err)
	}
}

// TestEveryConfigFieldIsPatched: each field of BackendConfig is set by a
// merge patch naming it and removed by null, and configsEqual tells a
// config with it from one without: a field added to BackendConfig needs
// no code here, and this test fails if one cannot be patched or compared.
func TestEveryConfigFieldIsPatched(t *testing.T) {
	values := map[reflect.Kind]any{reflect.Int: 3, reflect.Float64: 1.5, reflect.Map: map[string]any{"gpu": 1}, reflect.Slice: map[string]any{"t": 1},
		reflect.Pointer: map[string]any{}}
	typ := reflect.TypeFor[BackendConfig]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		v, ok := values[f.Type.Kind()]
		if !ok {
			t.Fatalf("field %s (%s): no test value for its kind; add one", f.Name, f.Type.Kind())
		}
		if f.Type.Kind() == reflect.Pointer && f.Type.Elem() == reflect.TypeFor[AutoscalingConfig]() {
			v = map[string]any{"min_replicas": 1, "max_replicas": 2, "target_in_flight_requests": 1}
		}
		body, _ := stdjson.Marshal(map[string]any{name: v})
		p, err := ParseConfigPatch(body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		set, err := p.Apply(BackendConfig{})
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if reflect.ValueOf(set).Field(i).IsZero() {
			t.Errorf("%s left %s unset", body, f.Name)
		}
		if configsEqual(set, BackendConfig{}) {
			t.Errorf("configsEqual does not compare %s", f.Name)
		}
		null, _ := ParseConfigPatch([]byte(`{"` + name + `": null}`))
		if unset, err := null.Apply(set); err != nil || !reflect.ValueOf(unset).Field(i).IsZero() {
			t.Errorf("{%q: null}: %+v, %v; want it removed", name, unset, err)
		}
	}
}

// TestAtomicFieldsAreReplacedWhole: user_config and resources are
// replaced, not merged into (a member left in place, such as "fail",
// would keep replicas refusing the new config); other objects merge.
func TestAtomicFieldsAreReplacedWhole(t *testing.T) {
	c := BackendConfig{UserConfig: UserConfig(`{"fail":true,"temperature":0.5}`), Resources: map[string]int{"gpu": 1},
		Outlier: &OutlierDetection{Consecutive5xx: 3}}
	p, err := ParseConfigPatch([]byte(`{"user_config": {"temperature": 1}, "resources": {"tpu": 2}, "outlier": {"interval_s": 2}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c, err = p.Apply(c); err != nil {
		t.Fatal(err)
	}
	if string(c.UserConfig) != `{"temperature":1}` || len(c.Resources) != 1 || c.Resources["tpu"] != 2 {
		t.Fatalf("user_config %s, resources %v; want each replaced whole", c.UserConfig, c.Resources)
	}
	if c.Outlier == nil || c.Outlier.Consecutive5xx != 3 || c.Outlier.IntervalS != 2 {
		t.Fatalf("outlier %+v; want merged", c.Outlier)
	}
}
