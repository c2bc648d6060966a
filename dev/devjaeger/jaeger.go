// Package devjaeger runs a real Jaeger v2 (built by `make tools` from the
// pinned module in tools/jaeger) on loopback ports, spans in memory: the
// trace collector of the demo stack, the tests and the benchmarks. It
// receives OTLP over gRPC and answers Jaeger's query API, which Traces
// reads. Like devconsul, it fails rather than skips when Jaeger is missing.
package devjaeger

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/toolpath"
)

// Server is a running Jaeger.
type Server struct {
	// OTLP is where it receives spans (OTLP/gRPC), 127.0.0.1:port; Query
	// is its query API and UI, http://127.0.0.1:port.
	OTLP, Query string
	child       *proc.Process
	log         string
}

// Find returns jaeger: $SERVEMESH_JAEGER, else .tools/bin or $PATH.
func Find() (string, error) { return toolpath.Find("jaeger", "SERVEMESH_JAEGER", "") }

// config is a Jaeger v2 (OpenTelemetry Collector) configuration: OTLP/gRPC
// in, spans in memory, the query API and UI out, nothing else listening.
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// Start starts Jaeger logging into dir, receiving OTLP at otlp and
// answering queries at query (free loopback ports where ""), and waits
// until it answers.
func Start(ctx context.Context, dir, otlp, query string) (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, fmt.Errorf("the real Jaeger is required (`make tools` builds it into .tools/bin): %w", err)
	}
	grpcQuery, err := proc.FreeAddr(ctx, "127.0.0.1")
	if err != nil {
		return nil, err
	}
	for _, addr := range []*string{&otlp, &query} {
		if *addr == "" {
			if *addr, err = proc.FreeAddr(ctx, "127.0.0.1"); err != nil {
				return nil, err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{OTLP: otlp, Query: "http://" + query, log: filepath.Join(dir, "jaeger.log")}
	confPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(confPath, fmt.Appendf(nil, config, query, grpcQuery, otlp), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	if s.child, err = proc.Start(proc.Spec{Path: bin, Args: []string{"--config", confPath}, Stdout: logFile, Stderr: logFile}); err != nil {
		return nil, fmt.Errorf("jaeger: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := s.Services(ctx); err == nil {
			return s, nil
		} else if time.Now().After(deadline) || s.child.Exited() || ctx.Err() != nil {
			s.Stop()
			return nil, fmt.Errorf("jaeger at %s did not answer within 30s: %w; log:\n%s", s.Query, err, proc.LogTail(s.log, 2048))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops Jaeger.
func (s *Server) Stop() {
	if s.child != nil {
		_ = s.child.Stop(5 * time.Second)
	}
}

// Services lists the services Jaeger holds spans of.
func (s *Server) Services(ctx context.Context) ([]string, error) {
	var out struct {
		Data []string `json:"data"`
	}
	if err := s.get(ctx, "/api/services", &out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

// Trace is one trace as Jaeger's query API returns it.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span of a Trace.
type Span struct {
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	ProcessID     string      `json:"processID"`
	Tags          []Tag       `json:"tags"`
	Duration      int64       `json:"duration"` // microseconds
}

// Reference is a span's parent (CHILD_OF) or link (FOLLOWS_FROM).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// Tag is a span's attribute.
type Tag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// Process is the service that sent spans.
type Process struct {
	ServiceName string `json:"serviceName"`
}

// Tag returns the value of s's attribute key as a string, and whether s has it.
func (s Span) Tag(key string) (string, bool) {
	for _, t := range s.Tags {
		if t.Key == key {
			return fmt.Sprint(t.Value), true
		}
	}
	return "", false
}

// Trace returns the trace of id (32 hex digits), or an error if Jaeger
// holds none.
func (s *Server) Trace(ctx context.Context, id string) (*Trace, error) {
	var out struct {
		Data []Trace `json:"data"`
	}
	if err := s.get(ctx, "/api/traces/"+id, &out); err != nil {
		return nil, err
	}
	if len(out.Data) != 1 {
		return nil, fmt.Errorf("jaeger: %d traces of id %s", len(out.Data), id)
	}
	return &out.Data[0], nil
}

// Find returns the latest traces (up to 20) with a span of service named
// operation.
func (s *Server) Find(ctx context.Context, service, operation string) ([]Trace, error) {
	var out struct {
		Data []Trace `json:"data"`
	}
	q := url.Values{"service": {service}, "operation": {operation}, "limit": {"20"}, "lookback": {"1h"}}
	if err := s.get(ctx, "/api/traces?"+q.Encode(), &out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

func (s *Server) get(ctx context.Context, path string, into any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Query+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("jaeger: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("jaeger: GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("jaeger: GET %s: %w", path, err)
	}
	return nil
}
