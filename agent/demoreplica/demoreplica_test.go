package demoreplica

import (
	"context"
	"encoding/json"
	"net/http/httptest"
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
	if got != want || rec.Header().Get(BackendHeader) != "v2" || r.Served() != 1 {
		t.Fatalf("got %+v (header %q, served %d), want %+v", got, rec.Header().Get(BackendHeader), r.Served(), want)
	}
}
