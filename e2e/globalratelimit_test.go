//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/procfs"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/agent/ratelimit"
	"github.com/servemesh/servemesh/dev/devredis"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// TestGlobalRateLimitsHoldAcrossNodes: on the default mesh (mTLS, two
// nodes, a replica on each), each node's agent runs the real rate limit
// service (Envoy's envoyproxy/ratelimit) over one real Redis. An endpoint
// limited to 20 requests a second globally, sent 80 a second through both
// nodes for 5 whole seconds, answers 20 a second across both (within
// 10%), not 20 on each; its refusals are 429s with Retry-After and the
// x-ratelimit-* headers, and each node's agent counts them. A limit per
// tenant header counts each tenant across both nodes. With Redis killed,
// an endpoint that fails open answers every request (each waiting for the service's error) and one that fails
// closed refuses them (503); with Redis back, the closed one answers
// again. Token quotas (tokenQuotas) are shown on the same mesh.
func TestGlobalRateLimitsHoldAcrossNodes(t *testing.T) {
	t.Parallel()
	rl := startRateLimits(t)
	bin, redis, redisDir := rl.bin, rl.redis, rl.dir
	defer func() { redis.Stop() }()
	mesh := startTwoNodeMeshWith(t, "grl", nil, rl.args)
	mesh.createBackends(t, meshspec.Backend{Name: "grl", Process: demoProcess("grl", false), Config: meshspec.BackendConfig{NumReplicas: 2}})
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	for _, args := range [][]string{
		{"global", "--global-rate-limit", "20"},
		{"closed", "--global-rate-limit", "1000", "--global-rate-limit-failure-mode", "closed"},
		{"tenants", "--global-rate-limit", "6", "--global-rate-limit-unit", "hour", "--global-rate-limit-header", "x-tenant-id"},
	} {
		// --wait: every node's Envoy and rate limit service count it.
		if code, _, errOut := cli(t, env, append([]string{"endpoint", "create", args[0], "--route", "/" + args[0], "--backend", "grl", "--wait"}, args[1:]...)...); code != 0 {
			t.Fatalf("endpoint create %v: exit %d, %s", args, code, errOut)
		}
	}
	client := httpClient()
	get := func(node *mtlsNode, path, tenant string) (int, http.Header) {
		t.Helper()
		return getAsTenant(t, client, node, path, tenant)
	}
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		testutil.WaitFor(t, 60*time.Second, "the limited endpoints to answer on "+n.id, func() bool {
			a, _ := get(n, "/global", "")
			b, _ := get(n, "/closed", "")
			return a == http.StatusOK && b == http.StatusOK
		})
	}

	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		checkRateLimitServiceSealed(t, bin, n)
	}

	// 80 a second, alternating nodes, over 5 whole one-second windows
	// (the service counts in windows of the clock's seconds).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
	var ok1, ok2, refused atomic.Int32
	var refusal atomic.Pointer[http.Header]
	atRate(80, 4900*time.Millisecond, func(i int) {
		node, ok := mesh.n1, &ok1
		if i%2 == 1 {
			node, ok = mesh.n2, &ok2
		}
		switch status, h := get(node, "/global", ""); status {
		case http.StatusOK:
			ok.Add(1)
		case http.StatusTooManyRequests:
			refused.Add(1)
			refusal.Store(&h)
		default:
			t.Errorf("through %s: status %d", node.id, status)
		}
	})
	answered := ok1.Load() + ok2.Load()
	t.Logf("20 a second globally, 80 a second through both nodes for 5 windows: %d answered (%d through %s, %d through %s), %d refused",
		answered, ok1.Load(), mesh.n1.id, ok2.Load(), mesh.n2.id, refused.Load())
	if answered < 90 || answered > 110 || ok1.Load() == 0 || ok2.Load() == 0 {
		t.Errorf("%d answered over 5 windows; want 100 (20 a second across both nodes) within 10%%, through both", answered)
	}
	if h := refusal.Load(); h == nil || h.Get("Retry-After") == "" || h.Get("X-RateLimit-Limit") == "" {
		t.Errorf("a refused request's headers %v: want Retry-After and X-RateLimit-Limit", h)
	}
	testutil.WaitFor(t, 20*time.Second, "each node's agent to count the global refusals", func() bool {
		v1, found1 := scrapeMetric(t, mesh.n1.metr, "servemesh_rate_limited_total", "endpoint", "global", "limit", "global")
		v2, found2 := scrapeMetric(t, mesh.n2.metr, "servemesh_rate_limited_total", "endpoint", "global", "limit", "global")
		return found1 && found2 && v1+v2 >= float64(refused.Load())*0.9 && v1 > 0 && v2 > 0
	})

	// A tenant's 6 an hour, across both nodes; another tenant its own.
	tenantA := 0
	for i := range 12 {
		if status, _ := get([]*mtlsNode{mesh.n1, mesh.n2}[i%2], "/tenants", "tenant-a"); status == http.StatusOK {
			tenantA++
		}
	}
	tenantB := 0
	for range 8 {
		if status, _ := get(mesh.n2, "/tenants", "tenant-b"); status == http.StatusOK {
			tenantB++
		}
	}
	if tenantA != 6 || tenantB != 6 {
		t.Errorf("tenant a's 12 through both nodes: %d answered; tenant b's 8 through one: %d; want 6 each (each tenant's count shared by the nodes)", tenantA, tenantB)
	}
	if code, out, _ := cli(t, env, "status"); code != 0 || !strings.Contains(out, "20/second") || !strings.Contains(out, "refuse (closed)") {
		t.Errorf("status: exit %d, want the global limits listed:\n%s", code, out)
	}

	tokenQuotas(t, mesh, env)

	// The limit's store down: each endpoint's failure mode holds.
	redis.Kill()
	testutil.WaitFor(t, 20*time.Second, "the closed endpoint to refuse while Redis is down", func() bool {
		status, _ := get(mesh.n1, "/closed", "")
		return status == http.StatusServiceUnavailable
	})
	openOK, closedRefused := 0, 0
	down := time.Now()
	for i := range 20 {
		node := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
		if status, _ := get(node, "/global", ""); status == http.StatusOK {
			openOK++
		}
		if status, _ := get(node, "/closed", ""); status == http.StatusServiceUnavailable {
			closedRefused++
		}
	}
	t.Logf("Redis down: the open endpoint answered %d of 20, the closed one refused %d of 20; %v a request", openOK, closedRefused, time.Since(down)/40)
	if openOK != 20 || closedRefused != 20 {
		t.Errorf("Redis down: fail-open answered %d of 20 (want all, above its limit of 20 a second), fail-closed refused %d of 20 (want all)", openOK, closedRefused)
	}
	port := int(testutil.Port(redis.Addr))
	var err error
	if redis, err = devredis.Start(redisDir, port, redis.Password); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the closed endpoint to answer with Redis back", func() bool {
		a, _ := get(mesh.n1, "/closed", "")
		b, _ := get(mesh.n2, "/closed", "")
		return a == http.StatusOK && b == http.StatusOK
	})
}

// tokenQuotas: a model-routed endpoint with a quota of 200 tokens an hour
// per tenant (rate_limit.tokens), served by the stand-in model server,
// which answers with OpenAI's usage: each answer's tokens, JSON or
// streamed (the last chunk's usage), are charged when it ends, on either
// node, and a tenant's next request is refused with 429 once its answered
// tokens passed 200, while another tenant goes on.
func tokenQuotas(t *testing.T, mesh *twoNodeMesh, env []string) {
	mesh.createBackends(t, meshspec.Backend{Name: "llm", Process: modelServer("llm"), Config: meshspec.BackendConfig{NumReplicas: 2}})
	e := meshspec.Endpoint{Name: "chat", Route: "/v1/chat/completions", Methods: []string{"POST"},
		ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{"m": {Traffic: map[string]float64{"llm": 1}}}},
		RateLimit:    &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 200, Unit: "hour", Header: "x-tenant-id"}}}
	if _, err := mesh.c.CreateEndpoint(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	plain := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":50}`
	streamed := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":50,"stream":true,"stream_options":{"include_usage":true}}`
	tokens := func(body string) int { return demoreplica.PromptTokens([]byte(body)) + 50 }
	post := func(n *mtlsNode, path, tenant, body string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+n.public+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-tenant-id", tenant)
		resp, err := httpClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw), resp.Header
	}
	charged := func(n *mtlsNode, path, tenant, body string) (int, string, http.Header) {
		t.Helper()
		calls := rateLimitCalls(t, n)
		status, text, h := post(n, path, tenant, body)
		waitCharged(t, n, calls, status)
		return status, text, h
	}
	waitServed(t, mesh, "chat") // every node's rate limit service counts the quota
	// Tenant a, alternating nodes and answer kinds: each request passes
	// while the tokens answered before it are at most 200.
	spent, got, want := 0, []int{}, []int{}
	for i := range 5 {
		n, body := mesh.n1, plain
		if i%2 == 1 {
			n, body = mesh.n2, streamed
		}
		status, text, h := charged(n, "/v1/chat/completions", "tenant-a", body)
		got = append(got, status)
		if spent <= 200 {
			want = append(want, http.StatusOK)
			spent += tokens(body)
		} else {
			want = append(want, http.StatusTooManyRequests)
			if h.Get("Retry-After") == "" {
				t.Errorf("a request over its tenant's token quota: headers %v, want Retry-After", h)
			}
		}
		if status == http.StatusOK && body == streamed && (h.Get("Content-Type") != "text/event-stream" || !strings.Contains(text, "[DONE]") || !strings.Contains(text, "total_tokens")) {
			t.Errorf("a streamed answer through the usage reader: %s %q; want the whole event stream", h.Get("Content-Type"), text)
		}
	}
	t.Logf("tenant a's requests of %d and %d tokens through both nodes: %v (want %v)", tokens(plain), tokens(streamed), got, want)
	if !slices.Equal(got, want) {
		t.Errorf("tenant a's requests: %v; want %v (refused once its answered tokens passed 200)", got, want)
	}
	if status, _, _ := post(mesh.n2, "/v1/chat/completions", "tenant-b", plain); status != http.StatusOK {
		t.Errorf("tenant b while tenant a is over its quota: %d, want 200", status)
	}
	if code, out, _ := cli(t, env, "status"); code != 0 || !strings.Contains(out, "200 tokens/hour") {
		t.Errorf("status: exit %d, want the token quota listed:\n%s", code, out)
	}
	shadowQuota(t, mesh, env, charged, plain)
	perModelQuota(t, mesh, charged)
}

// perModelQuota: a model-routed endpoint's quota of 120 tokens an hour
// per model (rate_limit.tokens.per_model): model a's requests pass while
// its answered tokens are at most 120, then get 429, while model b's pass
// on its own count.
func perModelQuota(t *testing.T, mesh *twoNodeMesh, charged func(*mtlsNode, string, string, string) (int, string, http.Header)) {
	t.Helper()
	e := meshspec.Endpoint{Name: "permodel", Route: "/permodel", Methods: []string{"POST"},
		ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{"a": {Traffic: map[string]float64{"llm": 1}}, "b": {Traffic: map[string]float64{"llm": 1}}}},
		RateLimit:    &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 120, Unit: "hour", PerModel: true}}}
	if _, err := mesh.c.CreateEndpoint(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	waitServed(t, mesh, "permodel")
	ask := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}],"max_tokens":50}`
	}
	spent, got, want := 0, []int{}, []int{}
	for i := range 4 {
		status, _, _ := charged([]*mtlsNode{mesh.n1, mesh.n2}[i%2], "/permodel", "", ask("a"))
		got = append(got, status)
		if spent <= 120 {
			want = append(want, http.StatusOK)
			spent += demoreplica.PromptTokens([]byte(ask("a"))) + 50
		} else {
			want = append(want, http.StatusTooManyRequests)
		}
	}
	if !slices.Equal(got, want) || want[len(want)-1] != http.StatusTooManyRequests {
		t.Errorf("model a's requests: %v; want %v (refused once its answered tokens passed 120)", got, want)
	}
	if status, text, _ := charged(mesh.n1, "/permodel", "", ask("b")); status != http.StatusOK {
		t.Errorf("model b while model a is over its quota: %d %s; want 200 (a quota of its own)", status, text)
	}
}

// shadowQuota: a quota of 150 tokens an hour in shadow mode whose output
// tokens weigh 2 (rate_limit.tokens.weights, shadow) refuses nothing,
// and counts the requests it would have refused: those that came once
// the answers' weighed cost passed 150 (with the weights ignored, one
// fewer), on both nodes' metrics and in servemesh status.
func shadowQuota(t *testing.T, mesh *twoNodeMesh, env []string, charged func(*mtlsNode, string, string, string) (int, string, http.Header), plain string) {
	t.Helper()
	e := meshspec.Endpoint{Name: "shadowchat", Route: "/shadow", Methods: []string{"POST"}, Traffic: map[string]float64{"llm": 1},
		RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: 150, Unit: "hour", Weights: meshspec.TokenWeights{Input: 1, Output: 2}, Shadow: true}}}
	if _, err := mesh.c.CreateEndpoint(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	waitServed(t, mesh, "shadowchat")
	cost := demoreplica.PromptTokens([]byte(plain)) + 2*50
	spent, wouldRefuse := 0, 0
	for i := range 4 {
		n := []*mtlsNode{mesh.n1, mesh.n2}[i%2]
		if status, text, _ := charged(n, "/shadow", "", plain); status != http.StatusOK {
			t.Fatalf("request %d to a quota in shadow mode: %d %s; want 200 (it refuses nothing)", i, status, text)
		}
		if spent > 150 {
			wouldRefuse++
		}
		spent += cost
	}
	if wouldRefuse != 2 {
		t.Fatalf("the test's own sums: %d would-be refusals, want 2 (answers of %d weighed tokens)", wouldRefuse, cost)
	}
	counted := func() float64 {
		return metricValue(t, mesh.n1.metr, "servemesh_token_quota_shadow_refusals_total", "endpoint", "shadowchat") +
			metricValue(t, mesh.n2.metr, "servemesh_token_quota_shadow_refusals_total", "endpoint", "shadowchat")
	}
	testutil.WaitFor(t, 20*time.Second, "the nodes to count the would-be refusals", func() bool {
		_, found1 := scrapeMetric(t, mesh.n1.metr, "servemesh_token_quota_shadow_refusals_total", "endpoint", "shadowchat")
		_, found2 := scrapeMetric(t, mesh.n2.metr, "servemesh_token_quota_shadow_refusals_total", "endpoint", "shadowchat")
		return found1 && found2 && counted() >= float64(wouldRefuse)
	})
	if got := counted(); got != float64(wouldRefuse) {
		t.Errorf("would-be refusals counted: %v; want %d", got, wouldRefuse)
	}
	want := fmt.Sprintf("150 tokens/hour (weighed: input 1, output 2, cached 0) (shadow: would have refused %d)", wouldRefuse)
	testutil.WaitFor(t, 30*time.Second, "servemesh status to say what the quota would have refused", func() bool {
		code, out, _ := cli(t, env, "status")
		return code == 0 && strings.Contains(out, want)
	})
}

// checkRateLimitServiceSealed checks that no local user but the agent's
// (a replica's user: nobody) reaches node n's rate limit service. Issue
// 58, M6: the service's HTTP API was open on loopback, and a replica's
// user spent an endpoint's mesh-wide limit through its /json (429 for
// everyone after). Every TCP listener it has (its metrics, at least) is
// asked for a decision as nobody and must give none; every unix socket it
// has bound must refuse nobody and take the agent's user.
func checkRateLimitServiceSealed(t *testing.T, bin string, n *mtlsNode) {
	t.Helper()
	pids := processesOf(bin, n.workDir)
	if len(pids) != 1 {
		t.Fatalf("node %s: rate limit service processes %v; want one", n.id, pids)
	}
	tcp := tcpListeners(t, pids[0])
	if len(tcp) == 0 {
		t.Fatalf("node %s: the rate limit service (pid %d) listens on no TCP address; want its metrics' at least", n.id, pids[0])
	}
	ask := `{"domain":"` + wire.RateLimitDomain + `","descriptors":[{"entries":[{"key":"generic_key","value":"global"}]}]}`
	for _, addr := range tcp {
		out, _ := asNobody(t, "curl", "-s", "-m", "5", "-d", ask, "http://"+addr+"/json")
		if strings.Contains(out, "overallCode") {
			t.Errorf("node %s: nobody (a replica's user) asked the rate limit service at %s/json for a decision and got it: %s", n.id, addr, out)
		}
	}
	socks := boundUnixSockets(t, pids[0])
	if len(socks) == 0 {
		t.Fatalf("node %s: the rate limit service (pid %d) has bound no unix socket; want the one Envoy calls", n.id, pids[0])
	}
	ctx := context.Background()
	for _, sock := range socks {
		if out, err := connectUnix(ctx, nil, sock); err != nil {
			t.Errorf("node %s: the agent's user cannot connect to the rate limit service's %s: %v %s", n.id, sock.path, err, out)
		}
		if out, err := connectUnix(ctx, &syscall.Credential{Uid: 65534, Gid: 65534}, sock); err == nil || !strings.Contains(out, "PermissionError") {
			t.Errorf("node %s: nobody (a replica's user) connecting to the rate limit service's %s: %v %s; want permission denied", n.id, sock.path, err, out)
		}
	}
}

// tcpListeners are the addresses (host:port) of the TCP sockets process
// pid listens on.
func tcpListeners(t *testing.T, pid int) []string {
	t.Helper()
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	p, err := fs.Proc(pid)
	if err != nil {
		t.Fatal(err)
	}
	targets, err := p.FileDescriptorTargets()
	if err != nil {
		t.Fatal(err)
	}
	held := map[uint64]bool{}
	for _, target := range targets {
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(inode, "]"), 10, 64)
			held[n] = true
		}
	}
	var out []string
	for _, table := range []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6} { //nolint:staticcheck // a test reads it once
		lines, err := table()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			if l.St == 0x0A && held[l.Inode] { // TCP_LISTEN
				out = append(out, net.JoinHostPort(l.LocalAddr.String(), strconv.FormatUint(l.LocalPort, 10)))
			}
		}
	}
	return out
}

// processesOf finds the processes running binary whose working folder is
// under one of dirs.
func processesOf(binary string, dirs ...string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if !strings.HasPrefix(string(cmdline), binary+"\x00") {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && underAny(cwd, dirs) {
			out = append(out, pid)
		}
	}
	return out
}

// rateLimitStore is a real Redis for the nodes' rate limit services, and
// the agent arguments that run those services on it.
type rateLimitStore struct {
	redis *devredis.Server
	dir   string // Redis's folder (to start it again there)
	bin   string // the rate limit service
	args  []string
}

// startRateLimits starts the store; the caller stops its Redis.
func startRateLimits(t *testing.T) *rateLimitStore {
	t.Helper()
	bin, err := ratelimit.Find("")
	if err != nil {
		t.Fatalf("the real rate limit service is required (`make tools` builds it): %v", err)
	}
	dir := t.TempDir()
	redis, err := devredis.Start(dir, 0, "e2e-redis-password")
	if err != nil {
		t.Fatal(err)
	}
	passwordFile := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(passwordFile, []byte(redis.Password+"\n"), 0o600); err != nil {
		redis.Stop()
		t.Fatal(err)
	}
	return &rateLimitStore{redis: redis, dir: dir, bin: bin,
		args: []string{"--rate-limit-redis", redis.Addr, "--rate-limit-redis-password-file", passwordFile, "--rate-limit-service", bin}}
}

// rateLimitArgs are agent arguments that run the nodes' rate limit
// services on a Redis of the test's own.
func rateLimitArgs(t *testing.T) []string {
	t.Helper()
	rl := startRateLimits(t)
	t.Cleanup(rl.redis.Stop)
	return rl.args
}

// rateLimitCalls is how many calls n's Envoy has made to its node's rate
// limit service and had answered (the service's cluster carries nothing
// else).
func rateLimitCalls(t *testing.T, n *mtlsNode) float64 {
	t.Helper()
	return envoyStat(t, n.admin, "cluster."+wire.RateLimitCluster+".upstream_rq_completed")
}

// waitCharged waits until the rate limit calls of one request through n
// of a token-quota endpoint have been answered, counted from calls (what
// rateLimitCalls read before it): its check, and, if it was served, the
// charge of its answer's tokens. Envoy sends the charge as the answer
// ends, so the answer can reach its client before the charge lands; a
// test that expects the next request refused waits for it.
func waitCharged(t *testing.T, n *mtlsNode, calls float64, status int) {
	t.Helper()
	want := calls + 1
	if status == http.StatusOK {
		want++
	}
	testutil.WaitFor(t, 30*time.Second, "the request's rate limit check and charge answered", func() bool {
		return rateLimitCalls(t, n) >= want
	})
}

// TestARateLimitServiceDownIsAProblem: nodes whose rate limit services
// cannot run (their Redis is nowhere) while an endpoint has a global
// limit are each a problem in `servemesh status`, naming the node and
// why: such a service once exited at every start, and every request
// passed fail-open with nothing said anywhere.
func TestARateLimitServiceDownIsAProblem(t *testing.T) {
	t.Parallel()
	bin, err := ratelimit.Find("")
	if err != nil {
		t.Fatalf("the real rate limit service is required (`make tools` builds it): %v", err)
	}
	nowhere := freeAddr(t) // nothing listens there
	mesh := startTwoNodeMeshWith(t, "rldown", nil, []string{"--rate-limit-redis", nowhere, "--rate-limit-service", bin})
	mesh.createBackends(t, meshspec.Backend{Name: "rldown", Process: demoProcess("rldown", false), Config: meshspec.BackendConfig{NumReplicas: 2}})
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr}
	if code, _, errOut := cli(t, env, "endpoint", "create", "limited", "--route", "/limited", "--backend", "rldown", "--global-rate-limit", "20"); code != 0 {
		t.Fatalf("endpoint create: exit %d, %s", code, errOut)
	}
	var out string
	testutil.WaitFor(t, 60*time.Second, "status to name both nodes' rate limit services as down", func() bool {
		_, out, _ = cli(t, env, "status")
		return strings.Contains(out, "node "+mesh.n1.id+": its rate limit service cannot be reached") &&
			strings.Contains(out, "node "+mesh.n2.id+": its rate limit service cannot be reached")
	})
	if !strings.Contains(out, "token quotas of limited are not counted there") {
		t.Errorf("status does not say what is not counted:\n%s", out)
	}
	// The console marks each node's failed service.
	page := browserPage(t, chromiumBin(t))
	if err := chromedp.Do(page, chromedp.Navigate("http://"+mesh.ctl.apiAddr+"/ui/")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*mtlsNode{mesh.n1, mesh.n2} {
		waitText(page, t, "#node-"+n.id+" .bad.components", "✗ rate limit service: ")
	}
	waitText(page, t, "#problems", "its rate limit service cannot be reached")
}
