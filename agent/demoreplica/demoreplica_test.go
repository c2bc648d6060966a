package demoreplica

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
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
