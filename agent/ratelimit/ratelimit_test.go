package ratelimit

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"

	"github.com/servemesh/servemesh/dev/devredis"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

func limited(name string, g meshspec.GlobalRateLimit) meshspec.Endpoint {
	return meshspec.Endpoint{Name: name, RateLimit: &meshspec.RateLimit{Global: &g}}
}

// TestConfigNestsEachEndpointsKey: each endpoint with a global limit is a
// descriptor of its own, with its header's or address's values nested
// under it at the same limit; endpoints without one are left out.
func TestConfigNestsEachEndpointsKey(t *testing.T) {
	m := &meshspec.Model{Endpoints: []meshspec.Endpoint{
		limited("shared", meshspec.GlobalRateLimit{Requests: 100, Unit: "minute"}),
		{Name: "open"},
		limited("keys", meshspec.GlobalRateLimit{Requests: 5, Header: "x-api-key", FailureMode: meshspec.FailClosed}),
		limited("clients", meshspec.GlobalRateLimit{Requests: 7, ClientAddress: true}),
		{Name: "chat", RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 5000, Header: "x-tenant-id"}}},
	}}
	got, err := Config(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{"domain: servemesh", "value: clients", "key: remote_address", "value: keys", "key: servemesh_key",
		"value: shared", "unit: minute", "requests_per_unit: 100", "key: servemesh_tokens", "requests_per_unit: 5000"} {
		if !strings.Contains(string(got), part) {
			t.Errorf("config lacks %q:\n%s", part, got)
		}
	}
	if strings.Contains(string(got), "open") {
		t.Errorf("config names an endpoint without a limit:\n%s", got)
	}
	if h, i, j, k := strings.Index(string(got), "value: chat"), strings.Index(string(got), "value: clients"), strings.Index(string(got), "value: keys"), strings.Index(string(got), "value: shared"); h > i || i > j || j > k {
		t.Errorf("descriptors not sorted by endpoint:\n%s", got)
	}
	empty, err := Config(nil)
	if err != nil || string(empty) != "descriptors: []\ndomain: servemesh\n" {
		t.Errorf("Config(nil) = %q, %v", empty, err)
	}
}

// ask sends the node's service one request's descriptor, as Envoy does.
func ask(t *testing.T, client rls.RateLimitServiceClient, entries ...string) rls.RateLimitResponse_Code {
	t.Helper()
	d := &core.RateLimitDescriptor{}
	for i := 0; i+1 < len(entries); i += 2 {
		d.Entries = append(d.Entries, &core.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: wire.RateLimitDomain, Descriptors: []*core.RateLimitDescriptor{d}, HitsAddend: 1})
	if err != nil {
		t.Fatalf("ShouldRateLimit %v: %v", entries, err)
	}
	return resp.GetOverallCode()
}

// TestServiceCountsFollowsAndIsAdopted runs the real service (Envoy's
// envoyproxy/ratelimit, with a real Redis): it counts each endpoint's
// requests and each header value's apart, reports what it refused by
// endpoint, reloads its configuration when the desired state changes, and
// a restarted agent adopts it rather than starting another.
func TestServiceCountsFollowsAndIsAdopted(t *testing.T) {
	bin, err := Find("")
	if err != nil {
		t.Fatalf("the real rate limit service is required (`make tools` builds it): %v", err)
	}
	dir := t.TempDir()
	redis, err := devredis.Start(dir, 0, "s3cret-for-tests")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(redis.Stop)
	var desired atomic.Pointer[meshspec.Model]
	desired.Store(&meshspec.Model{Endpoints: []meshspec.Endpoint{
		limited("api", meshspec.GlobalRateLimit{Requests: 3, Unit: "hour"}),
		limited("keys", meshspec.GlobalRateLimit{Requests: 2, Unit: "hour", Header: "x-api-key"}),
	}})
	envoyDir := filepath.Join(dir, "envoy")
	if err := os.MkdirAll(envoyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The folder is given as users give --work-dir, relative to where the
	// agent runs: the service runs in a folder of its own, and once took
	// such paths from there (it exited at start-up, every time).
	t.Chdir(dir)
	o := Options{Binary: bin, Redis: redis.Addr, Password: redis.Password, Dir: "envoy",
		Desired: desired.Load, Logger: slog.New(slog.DiscardHandler)}
	first, stopFirst := runService(t, o)
	conn, err := grpc.NewClient("unix://"+filepath.Join(envoyDir, wire.RateLimitSocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := rls.NewRateLimitServiceClient(conn)
	if err := testutil.Until(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := client.ShouldRateLimit(ctx, &rls.RateLimitRequest{Domain: wire.RateLimitDomain,
			Descriptors: []*core.RateLimitDescriptor{{Entries: []*core.RateLimitDescriptor_Entry{{Key: "probe", Value: "x"}}}}})
		return err == nil
	}); err != nil {
		t.Fatalf("the service never answered on its socket: %v; log:\n%s", err, readLog(envoyDir))
	}
	api := []string{wire.RateLimitEndpointKey, "api"}
	for i, want := range []rls.RateLimitResponse_Code{rls.RateLimitResponse_OK, rls.RateLimitResponse_OK, rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT} {
		if got := ask(t, client, api...); got != want {
			t.Fatalf("api request %d: %v, want %v", i+1, got, want)
		}
	}
	for _, key := range []string{"tenant-a", "tenant-b"} {
		keyed := []string{wire.RateLimitEndpointKey, "keys", wire.RateLimitHeaderKey, key}
		for i, want := range []rls.RateLimitResponse_Code{rls.RateLimitResponse_OK, rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT} {
			if got := ask(t, client, keyed...); got != want {
				t.Fatalf("keys request %d of %s: %v, want %v (each value counts apart)", i+1, key, got, want)
			}
		}
	}
	// It has answered by the state's limits: its report says so, and that
	// it has loaded them. Both come from the service's own metrics, which
	// it publishes in its own time (make flake saw the refusals counted in
	// one scrape before the load was).
	var report Report
	want := limitsOf(desired.Load())
	if err := testutil.Until(15*time.Second, func() bool {
		report, err = first.Report(context.Background())
		return err == nil && report.OverLimit["api"] == 1 && report.OverLimit["keys"] == 2 && maps.Equal(report.Loaded, want)
	}); err != nil {
		t.Fatalf("Report = %+v, %v; want api 1 and keys 2 refused, and loaded %v", report, err, want)
	}

	// A restarted agent adopts the service its predecessor left.
	stopFirst()
	pid := first.child.Pid()
	if !first.child.Identity().Alive() {
		t.Fatal("the service stopped with its agent; it should be left serving")
	}
	second, stopSecond := runService(t, o)
	defer stopSecond()
	if err := testutil.Until(5*time.Second, func() bool {
		second.mu.Lock()
		defer second.mu.Unlock()
		return second.child != nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := second.child.Pid(); got != pid {
		t.Fatalf("the restarted agent runs service %d; want the one left, %d", got, pid)
	}

	// A raised limit is reloaded, and said to be once it is: from the
	// moment the report says so, api's fourth request is within it.
	raised := &meshspec.Model{Endpoints: []meshspec.Endpoint{limited("api", meshspec.GlobalRateLimit{Requests: 100, Unit: "hour"})}}
	desired.Store(raised)
	if err := testutil.Until(20*time.Second, func() bool {
		report, err = second.Report(context.Background())
		return err == nil && maps.Equal(report.Loaded, limitsOf(raised))
	}); err != nil {
		t.Fatalf("the raised limit was not reported loaded: %+v, %v; log:\n%s", report, err, readLog(envoyDir))
	}
	if got := ask(t, client, api...); got != rls.RateLimitResponse_OK {
		t.Fatalf("api's fourth request once the raised limit is reported loaded: %v, want OK", got)
	}
	stopSecond()

	// agent --stop-all stops what the agent left; an agent run with
	// --stop-on-exit stops its own.
	if got, err := StopLeft(envoyDir, 5*time.Second); err != nil || got != pid || first.child.Identity().Alive() {
		t.Fatalf("StopLeft = %d, %v; want %d stopped", got, err, pid)
	}
	if got, err := StopLeft(envoyDir, time.Second); err != nil || got != 0 {
		t.Fatalf("StopLeft with nothing left = %d, %v; want 0, nil", got, err)
	}
	o.StopOnExit = true
	third, stopThird := runService(t, o)
	if err := testutil.Until(10*time.Second, func() bool {
		third.mu.Lock()
		defer third.mu.Unlock()
		return third.child != nil
	}); err != nil {
		t.Fatal(err)
	}
	stopThird()
	if third.child.Identity().Alive() {
		t.Error("the service outlived an agent that stops it on exit")
	}
}

// runService runs a Service until the returned func is called.
func runService(t *testing.T, o Options) (*Service, func()) {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a failed test leaves no detached service behind
		if rec, err := s.readRecord(); err == nil {
			if p, err := proc.Adopt(rec.Process); err == nil {
				_ = p.Kill()
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	return s, func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

func readLog(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "ratelimit", "service.log"))
	return string(b)
}

// limitsOf is the limits m's endpoints have the nodes' services count.
func limitsOf(m *meshspec.Model) map[string]string {
	out := map[string]string{}
	for _, e := range m.Endpoints {
		if l := e.CountedLimits(); l != "" {
			out[e.Name] = l
		}
	}
	return out
}

// TestShadowQuotaCountsWithoutRefusing: a token quota in shadow mode is
// the service's quota mode, at every level of its descriptor, so the
// service refuses nothing and names what it would have refused; an
// enforced quota is not.
func TestShadowQuotaCountsWithoutRefusing(t *testing.T) {
	m := &meshspec.Model{Endpoints: []meshspec.Endpoint{
		{Name: "tried", RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 100, Header: "x-tenant-id", Shadow: true}}},
		{Name: "enforced", RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 100, Header: "x-tenant-id"}}},
	}}
	got, err := Config(m)
	if err != nil {
		t.Fatal(err)
	}
	var c serviceConfig
	if err := yaml.Unmarshal(got, &c); err != nil {
		t.Fatal(err)
	}
	for _, d := range c.Descriptors {
		shadow := d.Value == "tried"
		if d.QuotaMode != shadow || len(d.Descriptors) != 1 || d.Descriptors[0].QuotaMode != shadow {
			t.Errorf("endpoint %s: quota mode %v, its header's %+v; want %v at both levels:\n%s", d.Value, d.QuotaMode, d.Descriptors, shadow, got)
		}
	}
	if len(c.Descriptors) != 2 {
		t.Errorf("%d descriptors, want the two quotas':\n%s", len(c.Descriptors), got)
	}
}
