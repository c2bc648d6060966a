package demoreplica

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// BackendHeader is the response header naming the backend that answered.
const BackendHeader = "X-Servemesh-Backend"

// Response is the JSON body a replica answers with.
type Response struct {
	Backend string `json:"backend"`
	Replica string `json:"replica"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Host    string `json:"host"`
}

// Replica is one demo replica's handler.
type Replica struct {
	Backend     string
	Name        string
	served      atomic.Int64
	inFlight    atomic.Int64
	maxInFlight atomic.Int64
}

// Served is how many requests the replica has answered.
func (r *Replica) Served() int64 { return r.served.Load() }

// MaxInFlight is the most requests the replica has had in progress at once.
func (r *Replica) MaxInFlight() int64 { return r.maxInFlight.Load() }

// ServeHTTP answers with the backend's identity. A `sleep_ms` query parameter
// delays the answer, to simulate slow inference.
func (r *Replica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for peak := r.maxInFlight.Load(); now > peak && !r.maxInFlight.CompareAndSwap(peak, now); peak = r.maxInFlight.Load() {
	}
	if ms, err := strconv.Atoi(req.URL.Query().Get("sleep_ms")); err == nil && ms > 0 && ms <= 60_000 {
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-req.Context().Done():
			return
		}
	}
	r.served.Add(1)
	w.Header().Set(BackendHeader, r.Backend)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Response{Backend: r.Backend, Replica: r.Name, Method: req.Method, Path: req.URL.Path, Host: req.Host})
}
