package demoreplica

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/servemesh/servemesh/wire"
)

// BackendHeader and ReplicaHeader are the response headers naming the
// backend and the replica that answered.
const (
	BackendHeader = "X-Servemesh-Backend"
	ReplicaHeader = "X-Servemesh-Replica"
	// TraceparentHeader echoes the W3C trace context the replica got, so
	// a test sees that the mesh propagated it.
	TraceparentHeader = "X-Servemesh-Traceparent"
)

// maxTokens bounds a streamed answer.
const maxTokens = 10_000

// Response is the JSON body a replica answers with.
type Response struct {
	Backend string `json:"backend"`
	Replica string `json:"replica"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Host    string `json:"host"`
	// Shadow is the request's wire.ShadowHeader: the endpoint whose shadow
	// it is, if it is a mirrored copy.
	Shadow string `json:"shadow,omitempty"`
	// Config is the user_config the replica took (ReconfigurePath).
	Config json.RawMessage `json:"config,omitempty"`
}

// ReconfigurePath is where a demo replica takes its backend's user_config
// (process.reconfigure_path): it answers with it from then on, and refuses
// a config whose "fail" is true, as a model server refuses a bad one. The
// config's Faults make it a bad version to roll out, for tests and demos.
const ReconfigurePath = "/-/reconfigure"

// Faults are what a demo replica's user_config can make it do wrong.
type Faults struct {
	// ErrorRate is the share of requests answered 500, at random.
	ErrorRate float64 `json:"error_rate"`
	// DelayMs is added to every answer.
	DelayMs int `json:"delay_ms"`
	// FailShadows answers 500 to every mirrored copy (wire.ShadowHeader).
	FailShadows bool `json:"fail_shadows"`
}

// Replica is one demo replica's handler.
type Replica struct {
	Backend     string
	Name        string
	config      atomic.Pointer[json.RawMessage]
	faults      atomic.Pointer[Faults]
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
	w.Header().Set(BackendHeader, r.Backend)
	w.Header().Set(ReplicaHeader, r.Name)
	if tp := req.Header.Get("traceparent"); tp != "" {
		w.Header().Set(TraceparentHeader, tp)
	}
	if req.URL.Path == ReconfigurePath && req.Method == http.MethodPost {
		r.reconfigure(w, req)
		return
	}
	if strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		r.served.Add(1)
		echoUpgraded(w, r.Backend, r.Name)
		return
	}
	if r.faulty(w, req) {
		return
	}
	if q := req.URL.Query(); q.Get("fail_replica") != "" && q.Get("fail_replica") == r.Name {
		// A faulty replica, for tests: this one answers with fail_status.
		status, err := strconv.Atoi(q.Get("fail_status"))
		if err != nil || status < 500 || status > 599 {
			status = http.StatusInternalServerError
		}
		r.served.Add(1)
		http.Error(w, "failing on purpose (fail_replica)", status)
		return
	}
	if n, err := strconv.Atoi(req.URL.Query().Get("tokens")); err == nil && n > 0 && n <= maxTokens {
		r.served.Add(1)
		every, _ := strconv.Atoi(req.URL.Query().Get("every_ms"))
		stream(w, req, n, time.Duration(min(max(every, 0), 60_000))*time.Millisecond)
		return
	}
	r.served.Add(1)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Response{Backend: r.Backend, Replica: r.Name, Method: req.Method, Path: req.URL.Path, Host: req.Host,
		Shadow: req.Header.Get(wire.ShadowHeader), Config: r.configNow()})
}

// reconfigure takes a user_config, unless it says "fail": true, and only
// from its agent: with the secret of wire.ReconfigureTokenEnv, when the
// agent set one (a fleet run in one process by tests has none).
func (r *Replica) reconfigure(w http.ResponseWriter, req *http.Request) {
	if want := os.Getenv(wire.ReconfigureTokenEnv); want != "" &&
		subtle.ConstantTimeCompare([]byte(req.Header.Get(wire.ReconfigureTokenHeader)), []byte(want)) != 1 {
		http.Error(w, "only this replica's agent may reconfigure it", http.StatusForbidden)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	var cfg struct {
		Fail bool `json:"fail"`
		Faults
	}
	if err == nil {
		err = json.Unmarshal(body, &cfg)
	}
	switch {
	case err != nil:
		http.Error(w, "not a JSON config: "+err.Error(), http.StatusBadRequest)
	case cfg.Fail:
		http.Error(w, "refusing a config that says fail", http.StatusInternalServerError)
	default:
		raw := json.RawMessage(body)
		r.config.Store(&raw)
		r.faults.Store(&cfg.Faults)
		w.WriteHeader(http.StatusNoContent)
	}
}

// faulty applies the faults of the replica's config to a request, and
// reports whether it answered it (with an error).
func (r *Replica) faulty(w http.ResponseWriter, req *http.Request) bool {
	f := r.faults.Load()
	if f == nil {
		return false
	}
	if f.DelayMs > 0 {
		select {
		case <-time.After(time.Duration(min(f.DelayMs, 60_000)) * time.Millisecond):
		case <-req.Context().Done():
			return true
		}
	}
	if (f.FailShadows && req.Header.Get(wire.ShadowHeader) != "") || (f.ErrorRate > 0 && rand.Float64() < f.ErrorRate) {
		r.served.Add(1)
		http.Error(w, "failing on purpose (user_config faults)", http.StatusInternalServerError)
		return true
	}
	return false
}

func (r *Replica) configNow() json.RawMessage {
	if c := r.config.Load(); c != nil {
		return *c
	}
	return nil
}

// stream answers n tokens, one every every, each flushed as it is made, as a
// model server streams a generation: lines "token <i>", or server-sent
// events ("data: token <i>") when the client accepts text/event-stream.
func stream(w http.ResponseWriter, req *http.Request, n int, every time.Duration) {
	sse := strings.Contains(req.Header.Get("Accept"), "text/event-stream")
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	flusher, _ := w.(http.Flusher)
	for i := range n {
		if i > 0 {
			select {
			case <-time.After(every):
			case <-req.Context().Done():
				return
			}
		}
		if sse {
			fmt.Fprintf(w, "data: token %d\n\n", i)
		} else {
			fmt.Fprintf(w, "token %d\n", i)
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}

// echoUpgraded accepts a WebSocket upgrade and echoes every byte the client
// sends (frames pass through as they are: a proxy only has to carry them).
func echoUpgraded(w http.ResponseWriter, backend, name string) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "upgrade not supported", http.StatusInternalServerError)
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	fmt.Fprintf(buf, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n%s: %s\r\n%s: %s\r\n\r\n",
		BackendHeader, backend, ReplicaHeader, name)
	if buf.Flush() != nil {
		return
	}
	_, _ = io.Copy(conn, buf)
}
