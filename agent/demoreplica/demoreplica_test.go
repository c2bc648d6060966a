package demoreplica

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/picker/prefix"
	"github.com/servemesh/servemesh/wire"
)

func TestReplicaSaysWhoItIs(t *testing.T) {
	r := &Replica{Backend: "v2", Name: "v2#abc"}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "POST", "http://api/predict?sleep_ms=1", nil))
	var got Response
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := Response{Backend: "v2", Replica: "v2#abc", Method: "POST", Path: "/predict", Host: "api"}
	if !reflect.DeepEqual(got, want) || rec.Header().Get(BackendHeader) != "v2" || r.Served() != 1 {
		t.Fatalf("got %+v (header %q, served %d), want %+v", got, rec.Header().Get(BackendHeader), r.Served(), want)
	}
}

func TestReplicaTakesItsConfig(t *testing.T) {
	r := &Replica{Backend: "v2", Name: "v2#abc"}
	post := func(body string) int {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "POST", "http://api"+ReconfigurePath, strings.NewReader(body)))
		return rec.Code
	}
	if code := post(`{"temperature":0.5}`); code != 204 {
		t.Fatalf("a good config: %d", code)
	}
	if code := post(`{"fail":true}`); code != 500 {
		t.Fatalf("a config that says fail: %d; want 500", code)
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "GET", "http://api/predict", nil))
	var got Response
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || string(got.Config) != `{"temperature":0.5}` {
		t.Fatalf("answer %s (%v); want the config it took", rec.Body, err)
	}
}

// TestReplicaFaultsFromItsConfig: a config's faults make the replica a bad
// version: errors at a rate, a delay, or failing mirrored copies only.
func TestReplicaFaultsFromItsConfig(t *testing.T) {
	r := &Replica{Backend: "v2", Name: "v2#abc"}
	get := func(shadow bool) (int, time.Duration) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequestWithContext(context.Background(), "GET", "http://api/predict", nil)
		if shadow {
			req.Header.Set(wire.ShadowHeader, "gen")
		}
		start := time.Now()
		r.ServeHTTP(rec, req)
		return rec.Code, time.Since(start)
	}
	configure := func(body string) {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "POST", "http://api"+ReconfigurePath, strings.NewReader(body)))
		if rec.Code != 204 {
			t.Fatalf("config %s: %d", body, rec.Code)
		}
	}
	configure(`{"fail_shadows": true, "delay_ms": 20}`)
	if code, took := get(false); code != 200 || took < 20*time.Millisecond {
		t.Fatalf("a user's request: %d in %v", code, took)
	}
	if code, _ := get(true); code != 500 {
		t.Fatalf("a shadow: %d", code)
	}
	configure(`{"error_rate": 0.5}`)
	failed := 0
	for range 400 {
		if code, _ := get(false); code == 500 {
			failed++
		}
	}
	if failed < 120 || failed > 280 {
		t.Fatalf("%d of 400 failed at an error rate of 0.5", failed)
	}
}

// TestModelServerCachesPrefixes: with a prefix cache, a prompt served
// again is found in it whole and answered without its prefill, and the
// metrics count the lookups and hits as vLLM's do.
func TestModelServerCachesPrefixes(t *testing.T) {
	s := &ModelServer{Backend: "m", Name: "m#1", Slots: 2, Service: time.Millisecond, PrefillPerBlock: 5 * time.Millisecond, CacheBlocks: 100}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	body := `{"model":"m","prompt":"` + strings.Repeat("p", 10*prefix.BlockBytes) + `"}`
	ask := func() (ModelAnswer, time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body)) //nolint:noctx // a test's request
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var a ModelAnswer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatal(err)
		}
		return a, time.Since(start)
	}
	first, cold := ask()
	second, warm := ask()
	if first.Blocks != 10 || first.Cached != 0 || second.Cached != 10 {
		t.Fatalf("answers %+v then %+v: want 10 blocks, none cached, then all", first, second)
	}
	if cold < 50*time.Millisecond || warm >= cold {
		t.Fatalf("cold %v, warm %v: a cold prompt of 10 blocks takes at least 50 ms, a cached one less", cold, warm)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/metrics", nil))
	for _, want := range []string{`vllm:prefix_cache_queries_total{model_name="m"} 20`, `vllm:prefix_cache_hits_total{model_name="m"} 10`, `vllm:kv_cache_usage_perc`, `vllm:cache_config_info{block_size="16"} 1`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, rec.Body.String())
		}
	}
}
