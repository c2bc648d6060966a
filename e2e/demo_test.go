//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/dev/devjaeger"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// checkDemoTrace runs the banner's two lines that show a trace: a request
// with a trace context, then its trace read from the demo's Jaeger: the
// endpoint's span, the child of the request's context, and its try on a
// replica under it (the mirror is one request in five: not checked).
func checkDemoTrace(t *testing.T, banner string) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	if !strings.Contains(banner, "traceparent: 00-"+id+"-") {
		t.Fatalf("the banner shows no traced request:\n%s", banner)
	}
	_, rest, ok := strings.Cut(banner, "query API ")
	query, _, _ := strings.Cut(rest, "/api/traces")
	if !ok || !strings.HasPrefix(query, "http://127.0.0.1:") {
		t.Fatalf("the banner names no Jaeger query API:\n%s", banner)
	}
	// The banner's lines as printed, pasted together: the request, a wait
	// until Jaeger has the endpoint's span (the query once ran before the
	// trace was searchable, and printed nothing; then, under load, before
	// all its spans were in), and the query.
	runBanner(t, banner, "traceparent: 00-"+id, nil)
	runBanner(t, banner, "grep -Eq", nil)
	if got := runBanner(t, banner, "json.tool", nil); !strings.Contains(got, `"operationName": "model"`) {
		t.Errorf("the banner's trace query, right after its request: %q; want the endpoint's span", got)
	}
	jaeger := &devjaeger.Server{Query: query}
	testutil.WaitFor(t, 30*time.Second, "the banner's request's trace in the demo's Jaeger: the endpoint's span and its try under it", func() bool {
		tr, err := jaeger.Trace(context.Background(), id)
		if err != nil {
			return false
		}
		i := slices.IndexFunc(tr.Spans, func(s devjaeger.Span) bool { return s.OperationName == "model" && parentOf(s) == "00f067aa0ba902b7" })
		return i >= 0 && slices.ContainsFunc(tr.Spans, func(s devjaeger.Span) bool {
			return strings.HasPrefix(s.OperationName, "router model-v") && parentOf(s) == tr.Spans[i].SpanID
		})
	})
}

// TestDemoStack runs what `make run` runs, on free ports, and checks that
// the demo serves its split, that the CLI it suggests works, and that
// Ctrl-C stops everything.
// checkSecondStackRefused starts a second demo-stack with the first's
// addresses, as a second `make run` does: in the first's work folder, then
// in another. Each is refused before it starts anything, naming what holds
// the folder or the address, and prints no banner; the first keeps its
// logs and serves on.
func checkSecondStackRefused(t *testing.T, workDir string, firstPid int, args []string) {
	t.Helper()
	logBefore, err := os.Stat(filepath.Join(workDir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, want string }{
		{workDir, "another demo-stack, pid " + strconv.Itoa(firstPid)},
		{t.TempDir(), "is in use by pid"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		second := exec.CommandContext(ctx, servemeshBin, append([]string{"demo-stack", "--work-dir", c.dir}, args...)...)
		second.Env = append(second.Environ(), "SERVEMESH_ENVOY="+envoyBin)
		second.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		began := time.Now()
		text, err := second.CombinedOutput()
		cancel()
		if err == nil || strings.Contains(string(text), "Try:") || !strings.Contains(string(text), c.want) {
			t.Fatalf("a second demo-stack in %s: %v after %s\n%s\nwant it refused, saying %q, with no banner", c.dir, err, time.Since(began), text, c.want)
		}
		t.Logf("a second demo-stack in %s, refused in %s: %s", c.dir, time.Since(began).Round(time.Millisecond), strings.TrimSpace(string(text)))
	}
	if logAfter, err := os.Stat(filepath.Join(workDir, "controller.log")); err != nil || logAfter.Size() < logBefore.Size() {
		t.Fatalf("the first demo's controller.log after the second was refused: %v, %d bytes (was %d)", err, logAfter.Size(), logBefore.Size())
	}
}

// bannerCommand is the banner's command whose first line contains marker,
// its continuation lines (after a pipe or a backslash) joined; "" if none.
func bannerCommand(banner, marker string) string {
	var cmd []string
	for l := range strings.SplitSeq(banner, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case len(cmd) == 0 && strings.Contains(l, marker):
			cmd = append(cmd, l)
		case len(cmd) > 0 && (strings.HasSuffix(cmd[len(cmd)-1], "|") || strings.HasSuffix(cmd[len(cmd)-1], "\\")):
			cmd = append(cmd, l)
		}
	}
	return strings.Join(cmd, "\n")
}

// runBanner runs the banner's command whose first line contains marker,
// as a user pasting it would (with SERVEMESH_SERVER exported), and
// returns what it printed.
func runBanner(t *testing.T, banner, marker string, env []string) string {
	t.Helper()
	line := bannerCommand(banner, marker)
	if line == "" {
		t.Fatalf("no command with %q in the banner:\n%s", marker, banner)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Env = append(os.Environ(), env...)
	text, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, text)
	}
	return string(text)
}

// checkBannerModelTraffic runs the banner's model-traffic lines as
// printed, which the default (mTLS) mode alone serves: five requests of a
// long shared prompt all reach one replica, which holds it in cache from
// the second on; and a token quota, created with --wait, refuses a tenant
// once its answers' usage has spent it.
func checkBannerModelTraffic(t *testing.T, banner string, env []string) {
	t.Helper()
	text := runBanner(t, banner, "-d @", env)
	lines := strings.Split(strings.TrimSpace(text), "\n")
	re := regexp.MustCompile(`^(llama#[0-9a-f]{6}) prompt blocks cached: (\d+) of (\d+)$`)
	var replicas []string
	for i, l := range lines {
		m := re.FindStringSubmatch(l)
		if m == nil || m[3] == "0" || i > 0 && m[2] != m[3] {
			t.Fatalf("the banner's prompt-affinity line printed:\n%s\nwant five answers, every one after the first with its whole prompt cached", text)
		}
		replicas = append(replicas, m[1])
	}
	if len(lines) != 5 || len(slices.Compact(replicas)) != 1 {
		t.Fatalf("the banner's prompt-affinity line printed:\n%s\nwant five answers from one replica", text)
	}
	checkBannerQuota(t, banner, env)
}

// checkBannerQuota runs the banner's token-quota lines as printed: created
// with --wait, the quota answers a tenant until the model server's usage
// passed it, then refuses it.
func checkBannerQuota(t *testing.T, banner string, env []string) {
	t.Helper()
	runBanner(t, banner, "endpoint create metered", env)
	got := strings.Fields(runBanner(t, banner, "/v1/completions -H", env))
	first429 := slices.Index(got, "429")
	if first429 < 1 || slices.ContainsFunc(got[:first429], func(s string) bool { return s != "200" }) || slices.ContainsFunc(got[first429:], func(s string) bool { return s != "429" }) {
		t.Fatalf("the banner's token-quota line printed %q; want 200 some times, then 429", got)
	}
	if code, o, e := cli(t, env, "endpoint", "delete", "metered"); code != 0 {
		t.Fatalf("endpoint delete metered: exit %d %s%s", code, o, e)
	}
}

// checkDemoConsulACLs: the demo's Consul refuses an anonymous write (a
// replica could otherwise mint identities from its CA), and the banner's
// consul line, with the token it names, lists the mesh's services.
func checkDemoConsulACLs(t *testing.T, banner string) {
	t.Helper()
	text := runBanner(t, banner, "catalog services", nil)
	if !strings.Contains(text, wire.BackendService("llama")) {
		t.Fatalf("the banner's consul line printed:\n%s\nwant the mesh's services", text)
	}
	addr := regexp.MustCompile(`CONSUL_HTTP_ADDR=(\S+)`).FindStringSubmatch(bannerCommand(banner, "catalog services"))
	anonymous, err := consulapi.NewClient(&consulapi.Config{Address: addr[1]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonymous.KV().Put(&consulapi.KVPair{Key: "servemesh/anonymous", Value: []byte("x")}, nil); err == nil {
		t.Fatal("the demo's Consul took an anonymous write; want ACLs on with default deny")
	}
}

// checkBannerCount runs the banner's one-liner that counts which backend
// answered 200 requests: it counted 400, matching two headers of each.
func checkBannerCount(t *testing.T, banner string) {
	t.Helper()
	var line string
	for l := range strings.SplitSeq(banner, "\n") {
		if strings.Contains(l, "seq 200") {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		t.Fatalf("no counting one-liner in the banner:\n%s", banner)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	text, err := exec.CommandContext(ctx, "bash", "-c", line).Output()
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	total, counts := 0, map[string]int{}
	for f := range strings.SplitSeq(strings.TrimSpace(string(text)), "\n") {
		var n int
		var backend string
		if _, err := fmt.Sscan(f, &n, &backend); err != nil {
			t.Fatalf("the one-liner printed %q: %v", f, err)
		}
		total, counts[backend] = total+n, n
	}
	if total != 200 || counts["model-v1"] == 0 || counts["model-v2"] == 0 || len(counts) != 2 {
		t.Fatalf("the banner's one-liner counted %v (%d in all); want 200, split between model-v1 and model-v2", counts, total)
	}
}

// demoStack is a running `servemesh demo-stack`: its addresses, work
// folder, process and what it printed.
type demoStack struct {
	api, public, mesh, workDir string
	args                       []string // its address flags
	cmd                        *exec.Cmd
	done                       chan error
	out                        *testutil.SyncBuffer
}

// startDemoStack starts `servemesh demo-stack` with extra flags, on free
// addresses and a folder of the test's, and waits for its banner.
func startDemoStack(t *testing.T, extra ...string) *demoStack {
	t.Helper()
	d := &demoStack{api: freeAddr(t), public: freeAddr(t), mesh: freeAddr(t), workDir: t.TempDir(), out: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	d.args = []string{"--consul-http-port", strconv.Itoa(int(testutil.Port(freeAddr(t)))), "--api", d.api, "--xds", freeAddr(t),
		"--public", d.public, "--mesh", d.mesh, "--inbound", freeAddr(t)}
	d.cmd = exec.CommandContext(context.Background(), servemeshBin, append(append([]string{"demo-stack", "--work-dir", d.workDir}, d.args...), extra...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	d.cmd.Env = append(d.cmd.Environ(), "SERVEMESH_ENVOY="+envoyBin)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("demo-stack output:\n%s", d.out.String())
		}
	})
	testutil.WaitFor(t, 90*time.Second, "the demo to be up", func() bool { return strings.Contains(d.out.String(), "Try:") })
	return d
}

// stop stops the demo as Ctrl-C does and waits until it has stopped
// everything it started.
func (d *demoStack) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("demo-stack exited with %v after Ctrl-C", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("demo-stack did not stop after Ctrl-C")
	}
}

func TestDemoStack(t *testing.T) {
	t.Parallel()
	python, runtime, src, models := pythonReplicas(t)
	d := startDemoStack(t, "--allow-command", python) // docs/python.md's model, on the demo
	api, public, mesh, workDir, cmd, out := d.api, d.public, d.mesh, d.workDir, d.cmd, d.out
	checkSecondStackRefused(t, workDir, cmd.Process.Pid, d.args)
	checkBannerCount(t, out.String())
	checkBannerModelTraffic(t, out.String(), []string{"SERVEMESH_SERVER=" + api})
	checkDemoConsulACLs(t, out.String())

	counts := sendMany(t, "http://"+public+"/model", 400)
	checkShare(t, "model-v1 (weight 0.9)", counts["model-v1"], 400, 0.9)
	if r := do(httpClient(), http.MethodGet, "http://"+mesh+"/", "embeddings"); r.status != 200 || r.backend != "embedder" {
		t.Fatalf("headless embeddings on the mesh listener: %+v", r)
	}
	// The OpenAI-style endpoint the demo suggests, routed by model.
	testutil.WaitFor(t, 30*time.Second, "the demo's chat endpoint to answer for mistral-7b", func() bool {
		status, backend, _, _, _ := postModel(httpClient(), "http://"+public+"/v1/chat/completions", `{"model": "mistral-7b", "messages": []}`)
		return status == http.StatusOK && backend == "mistral"
	})
	if status, _, _, text, _ := postModel(httpClient(), "http://"+public+"/v1/chat/completions", `{"model": "gpt-9"}`); status != http.StatusNotFound {
		t.Errorf("the demo's chat endpoint for an unknown model: %d %s, want 404", status, text)
	}
	checkDemoTrace(t, out.String())
	code, status, _ := cli(t, []string{"SERVEMESH_SERVER=" + api}, "status")
	if code != 0 || !strings.Contains(status, "model-v3-candidate") || !strings.Contains(status, "demo-node") {
		t.Fatalf("servemesh status: exit %d\n%s", code, status)
	}

	// A process backend, autoscaled, made with the CLI alone.
	env := []string{"SERVEMESH_SERVER=" + api}
	if code, o, e := cli(t, env, "backend", "create", "extra", "--command", servemeshBin, "--arg", "demo-replica",
		"--arg", "--backend", "--arg", "extra", "--arg", "--listen=${HOST}:${PORT}", "--health-path", "/",
		"--num-replicas", "2", "--autoscale-max", "3", "--autoscale-target", "2"); code != 0 {
		t.Fatalf("backend create --command: exit %d %s%s", code, o, e)
	}
	if code, o, e := cli(t, env, "endpoint", "create", "extra", "--route", "/extra", "--backend", "extra"); code != 0 {
		t.Fatalf("endpoint create: exit %d %s%s", code, o, e)
	}
	testutil.WaitFor(t, 30*time.Second, "the CLI-made process backend to serve", func() bool {
		return do(httpClient(), http.MethodGet, "http://"+public+"/extra", "").backend == "extra"
	})
	if _, list, _ := cli(t, env, "backend", "list"); !strings.Contains(list, "process servemesh") || !strings.Contains(list, "2/2") || !strings.Contains(list, "0..3 @2") {
		t.Fatalf("backend list:\n%s", list)
	}
	// describe: each replica with its address, node, health and age, and
	// the endpoint that uses the backend (issue 40).
	testutil.WaitFor(t, 20*time.Second, "backend describe to show both replicas ready", func() bool {
		_, d, _ := cli(t, env, "backend", "describe", "extra")
		return strings.Count(d, "  running  yes ") == 2 && strings.Count(d, "demo-node  127.0.0.1:") == 2 &&
			strings.Contains(d, "Replicas:       2 desired, 2 running, 2 ready") && strings.Contains(d, "extra     -      1       -")
	})
	// logs: each replica's log, read from its node's agent, each line
	// after its replica's tag; and the node's Envoy's (issue 40).
	if code, o, e := cli(t, env, "logs", "extra", "--tail", "5"); code != 0 || strings.Count(o, `msg="demo replica serving" cmd=demo-replica backend=extra replica=extra#`) != 2 ||
		!regexp.MustCompile(`(?m)^\[extra#[0-9a-f]{6}\] time=`).MatchString(o) {
		t.Fatalf("logs extra: exit %d\n%s%s", code, o, e)
	}
	// The demo's Envoy logs warnings alone: an empty log is said so, or
	// its lines printed.
	code, o, e := cli(t, env, "logs", "--node", "demo-node", "--tail", "3")
	empty := o == "" && strings.Contains(e, "node demo-node's Envoy has logged nothing yet")
	if lines := strings.Count(o, "\n") == 3 && e == ""; code != 0 || !empty && !lines {
		t.Fatalf("logs --node demo-node: exit %d\n%s%s", code, o, e)
	}
	if code, o, e := cli(t, env, "logs", "--node", "no-such-node"); code != 1 || o != "" || !strings.Contains(e, "node no-such-node has no live agent") {
		t.Fatalf("logs --node no-such-node: exit %d\n%s%s", code, o, e)
	}
	// A Python model, as docs/python.md serves it, on the
	// demo started with --allow-command naming its Python (issue 62, 3:
	// the demo's agent ran servemesh alone, and nothing could change it).
	if code, o, e := cli(t, env, "backend", "create", "pydemo", "--command", python, "--arg", runtime, "--arg", "--path", "--arg", src,
		"--arg", "--path", "--arg", models, "--arg", "--host", "--arg", "${HOST}", "--arg", "--port", "--arg", "${PORT}", "--arg", "model:Model",
		"--health-path", "/-/healthz", "--num-replicas", "1", "--wait"); code != 0 {
		t.Fatalf("backend create of a Python model: exit %d %s%s", code, o, e)
	}
	if code, o, e := cli(t, env, "endpoint", "create", "pydemo", "--route", "/pydemo", "--backend", "pydemo", "--wait"); code != 0 {
		t.Fatalf("endpoint create pydemo: exit %d %s%s", code, o, e)
	}
	if r := do(httpClient(), http.MethodGet, "http://"+public+"/pydemo", ""); r.status != 200 || r.backend != "pydemo" {
		t.Fatalf("the demo's Python model: %+v", r)
	}
	for _, args := range [][]string{{"endpoint", "delete", "pydemo"}, {"backend", "delete", "pydemo"}} {
		if code, o, e := cli(t, env, args...); code != 0 {
			t.Fatalf("%v: exit %d %s%s", args, code, o, e)
		}
	}
	if code, o, e := cli(t, env, "backend", "update", "extra", "--autoscale-off"); code != 0 || !strings.Contains(o, "updated") {
		t.Fatalf("backend update --autoscale-off: exit %d %s%s", code, o, e)
	}
	if code, o, e := cli(t, env, "endpoint", "delete", "extra"); code != 0 {
		t.Fatalf("endpoint delete: exit %d %s%s", code, o, e)
	}
	if code, o, e := cli(t, env, "backend", "delete", "extra"); code != 0 {
		t.Fatalf("backend delete: exit %d %s%s", code, o, e)
	}

	// The global rate limit the banner suggests, as printed: 5 a minute
	// per tenant, counted by the node's rate limit service in the demo's
	// Redis, from the moment its create returns (--wait).
	runBanner(t, out.String(), "endpoint create limited", env)
	if s := time.Now().Second(); s >= 58 { // all seven in one minute's window
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	if got := strings.TrimSpace(runBanner(t, out.String(), "/limited; done", env)); got != "200 200 200 200 200 429 429" {
		t.Errorf("the banner's seven requests of one tenant: %s; want five answered, then 429", got)
	}
	if code, o, e := cli(t, env, "endpoint", "delete", "limited"); code != 0 {
		t.Fatalf("endpoint delete: exit %d %s%s", code, o, e)
	}

	// Re-applying the state the demo wrote keeps every replica: no changes.
	code, applied, errOut := cli(t, []string{"SERVEMESH_SERVER=" + api}, "apply", "-f", workDir+"/mesh.yaml")
	if code != 0 || !strings.Contains(applied, "no changes") {
		t.Fatalf("servemesh apply -f mesh.yaml: exit %d\n%s%s", code, applied, errOut)
	}

	d.stop(t)
	if r := do(httpClient(), http.MethodGet, "http://"+public+"/model", ""); r.err == nil {
		t.Fatalf("the demo's Envoy still answers after the demo stopped: %+v", r)
	}
}

// TestDemoStackOnARealEngine: `make run MODEL=llama` (demo-stack
// --model-server llama) serves the demo's llama model with llama.cpp's
// server, and the banner's model-traffic lines work as printed: the long
// shared prompt asked five times is evaluated in full once, as the
// engine's own log (read with servemesh logs) says, and the token quota
// counts the engine's usage.
func TestDemoStackOnARealEngine(t *testing.T) {
	t.Parallel()
	findEngine(t)
	d := startDemoStack(t, "--model-server", "llama")
	banner := d.out.String()
	env := []string{"SERVEMESH_SERVER=" + d.api}
	times := strings.Fields(runBanner(t, banner, "-w '%{time_total}s\\n'", env))
	if len(times) != 5 {
		t.Fatalf("the banner's prompt line printed %q; want five times", times)
	}
	var full, warm []int
	for _, m := range promptEvaluation.FindAllStringSubmatch(runBanner(t, banner, "logs llama", env), -1) {
		if tokens, _ := strconv.Atoi(m[1]); tokens >= 1000 {
			full = append(full, tokens)
		} else {
			warm = append(warm, tokens)
		}
	}
	if len(full) != 1 || len(warm) != 4 {
		t.Fatalf("the engine evaluated the banner's long prompt in full %v and in part %v; want in full once, then the question alone four times", full, warm)
	}
	t.Logf("the banner's five requests took %v; the engine computed the prompt in full once (%d tokens), then %v tokens", times, full[0], warm)
	checkBannerQuota(t, banner, env)
	d.stop(t)
}
