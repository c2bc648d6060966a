// Package main measures servemesh's data path beside a baseline in one run:
// requests enter node n1's Envoy and are served by a replica on n1 itself
// (same-node) or on n2 (cross-node), through servemesh in its default mode
// (mTLS between nodes), in --plaintext mode, and through a minimal
// hand-written static Envoy configuration doing the same thing (this
// folder's envoy-*.yaml; for cross-node, mTLS with certificates the bench
// makes). Every Envoy runs one worker thread. It reports, as medians of
// -runs runs: throughput at saturation, p50 and p99 latency at a fixed
// rate, and the CPU the Envoys use per request.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/servemesh/servemesh/agent/ratelimit"
	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/dev/devepp"
	"github.com/servemesh/servemesh/dev/devjaeger"
	"github.com/servemesh/servemesh/dev/devredis"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// The placements of the replica, and the modes compared.
const (
	sameNode  = "same-node"
	crossNode = "cross-node"

	modeDefault   = "servemesh (mTLS)"
	modeLimited   = "servemesh (mTLS), rate-limited"
	modeGlobal    = "servemesh (mTLS), globally rate-limited"
	modeTraced1   = "servemesh (mTLS), traced 1%"
	modeTraced100 = "servemesh (mTLS), traced 100%"
	modePlaintext = "servemesh --plaintext"
	// The backend's replicas picked by the Inference Extension's
	// reference picker (tools/gie-epp), which every calling node asks.
	modeExternal = "servemesh (mTLS), external picker"
	modeBaseline = "hand-written Envoy"
	// The hand-written Envoys traced as servemesh's traced nodes are.
	modeBaselineTraced1   = "hand-written Envoy, traced 1%"
	modeBaselineTraced100 = "hand-written Envoy, traced 100%"
	modeDirect            = "direct to the replica"
)

// modes are the paths measured, in the order of the table.
var modes = []string{modeDefault, modePlaintext, modeBaseline, modeDirect}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func main() {
	rate := flag.Int("rate", 1000, "requests per second for the fixed-rate runs")
	duration := flag.Duration("duration", 5*time.Second, "length of each run")
	concurrency := flag.Int("concurrency", 16, "concurrent connections for the saturation runs")
	runs := flag.Int("runs", 3, "runs of each configuration; the figures are their medians")
	pause := flag.String("pause", "", "stop servemesh's daemons (SIGSTOP) while measuring, leaving the Envoys and the replica running: controller, agents or all; what they cost the data path on a shared machine")
	only := flag.String("placements", sameNode+","+crossNode, "the placements measured, comma-separated")
	noAccessLog := flag.Bool("no-access-log", false, "run servemesh's nodes without their access log (--no-access-log)")
	loadAware := flag.Bool("load-aware", false, "make servemesh's backend load-aware (config.load_aware): its node's picker chooses the replica of every request; also prints the agents' CPU per request (the plaintext run stays as it is: a mesh without mTLS refuses load_aware)")
	rateLimit := flag.Int("rate-limit", 0, "also measure servemesh (mTLS) with the endpoint's rate_limit.local at this many requests a second (set it above what the load sends: the filter's cost, nothing refused)")
	globalLimit := flag.Int("global-rate-limit", 0, "also measure servemesh (mTLS) with the endpoint's rate_limit.global at this many requests a second (each node's rate limit service over one Redis; set it above what the load sends: the call's cost, nothing refused)")
	external := flag.Bool("endpoint-picker", false, "also measure servemesh (mTLS) with the backend's replicas picked by an external picker (config.endpoint_picker): the Inference Extension's reference picker (gie-epp, which make tools builds) on loopback, asked by the calling node over the Endpoint Picker Protocol")
	traced := flag.Bool("tracing", false, "also measure servemesh (mTLS) with the mesh's tracing on, sampling 1% and 100%, every node's Envoy sending its spans to a real Jaeger v2 on loopback")
	protocol := flag.String("protocol", protoHTTP, "what the replica serves and the load sends: http (HTTP/1.1 GETs), grpc (unary gRPC calls over HTTP/2) or stream (HTTP/1.1 GETs of streamed tokens: the time to the first token)")
	flag.Parse()
	if !slices.Contains([]string{"", "controller", "agents", "all"}, *pause) {
		fmt.Fprintf(os.Stderr, "datapath: -pause %q: use controller, agents or all\n", *pause)
		os.Exit(2)
	}
	if !slices.Contains([]string{protoHTTP, protoGRPC, protoStream}, *protocol) {
		fmt.Fprintf(os.Stderr, "datapath: -protocol %q: use http, grpc or stream\n", *protocol)
		os.Exit(2)
	}
	o := options{rate: *rate, duration: *duration, concurrency: *concurrency, runs: *runs, pause: *pause, placements: strings.Split(*only, ","),
		protocol: *protocol, noAccessLog: *noAccessLog, loadAware: *loadAware, rateLimit: *rateLimit, globalLimit: *globalLimit, tracing: *traced, external: *external}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "datapath:", err)
		os.Exit(1)
	}
}

// result is one run of one configuration.
type result struct {
	rps, p50, p99, cpu float64 // req/s at saturation; ms at the fixed rate; Envoy CPU ms per request
	agentCPU           float64 // the agents' CPU ms per request at saturation
	pickerCPU          float64 // an external picker's CPU ms per request at saturation
	last99             float64 // for streams, the last token's p99 at the fixed rate, ms
	errors             int
	firstError         string
}

// options are the bench's flags.
type options struct {
	rate, concurrency, runs int
	duration                time.Duration
	pause                   string
	placements              []string
	protocol                string // protoHTTP, protoGRPC or protoStream
	noAccessLog             bool
	loadAware               bool
	rateLimit               int // requests a second of modeLimited's endpoint; 0: no such mode
	globalLimit             int // requests a second of modeGlobal's endpoint; 0: no such mode
	tracing                 bool
	external                bool // measure modeExternal too
}

// The protocols of -protocol.
const (
	protoHTTP   = "http"
	protoGRPC   = "grpc"
	protoStream = "stream"
)

func run(o options) error {
	be, err := benchenv.Start(context.Background(), "datapath")
	if err != nil {
		return err
	}
	defer be.Close()
	b := &bench{Env: be, options: o}
	all := map[string][]result{}
	measured := modes
	if o.rateLimit > 0 {
		measured = slices.Insert(slices.Clone(modes), 1, modeLimited)
		fmt.Printf("%s: the endpoint's rate_limit.local is %d requests a second on each node\n", modeLimited, o.rateLimit)
	}
	if o.globalLimit > 0 {
		measured = slices.Insert(slices.Clone(measured), 1, modeGlobal)
		fmt.Printf("%s: the endpoint's rate_limit.global is %d requests a second across the nodes\n", modeGlobal, o.globalLimit)
		redis, err := devredis.Start(be.Dir, 0, "bench-redis")
		if err != nil {
			return err
		}
		defer redis.Stop()
		b.redis = redis
	}
	if o.external {
		measured = slices.Insert(slices.Clone(measured), 1, modeExternal)
		fmt.Printf("%s: the backend's replicas are picked by the Inference Extension's reference picker (gie-epp) on loopback, which n1's Envoy asks for each request\n", modeExternal)
	}
	if o.tracing {
		measured = slices.Insert(slices.Clone(measured), 1, modeTraced1, modeTraced100)
		measured = slices.Insert(measured, slices.Index(measured, modeBaseline)+1, modeBaselineTraced1, modeBaselineTraced100)
		jaeger, err := devjaeger.Start(context.Background(), be.Dir, "", "")
		if err != nil {
			return err
		}
		defer jaeger.Stop()
		b.jaeger = jaeger
		fmt.Printf("traced: the mesh's tracing sends every node's spans to a Jaeger v2 at %s (memory store)\n", jaeger.OTLP)
	}
	for i := range o.runs {
		for _, placement := range o.placements {
			for j, mode := range measured {
				r, err := b.measure(fmt.Sprintf("r%d-%s-m%d", i, placement, j), placement, mode)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", placement, mode, err)
				}
				all[placement+mode] = append(all[placement+mode], r)
			}
		}
	}
	fmt.Printf("medians of %d runs; each fixed-rate and saturation run %s; Envoy CPU is every Envoy on the path, per request; load: %s\n",
		o.runs, o.duration, loadName(o.protocol))
	if o.pause != "" {
		fmt.Printf("servemesh's daemons stopped while measuring: %s\n", o.pause)
	}
	if o.noAccessLog {
		fmt.Println("servemesh's nodes run without their access log")
	}
	if o.loadAware {
		fmt.Println("servemesh's backend is load-aware: its node's picker (the agent, over ext_proc) chooses the replica of every request")
	}
	fmt.Println()
	stream := o.protocol == protoStream
	if stream {
		fmt.Printf("| call | path | saturation streams/s (%d connections) | first token p50 / p99 at %d streams/s | last token p99 | Envoy CPU per stream | errors |\n", o.concurrency, o.rate)
		fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	} else {
		fmt.Printf("| call | path | saturation req/s (%d connections) | p50 / p99 at %d req/s | Envoy CPU per request | errors |\n", o.concurrency, o.rate)
		fmt.Println("|---|---|---:|---:|---:|---:|")
	}
	for _, placement := range o.placements {
		for _, mode := range measured {
			rs := all[placement+mode]
			errors := 0
			for _, r := range rs {
				errors += r.errors
				if r.firstError != "" {
					defer fmt.Printf("first error (%s, %s): %s\n", placement, mode, r.firstError)
				}
			}
			last := ""
			if stream {
				last = fmt.Sprintf(" %.1f ms |", median(rs, func(r result) float64 { return r.last99 }))
			}
			cpu := "-" // no Envoy on the path
			if mode != modeDirect {
				cpu = fmt.Sprintf("%.3f ms", median(rs, func(r result) float64 { return r.cpu }))
			}
			fmt.Printf("| %s | %s | %.0f | %.3f / %.3f ms |%s %s | %d |\n", placement, mode,
				median(rs, func(r result) float64 { return r.rps }), median(rs, func(r result) float64 { return r.p50 }),
				median(rs, func(r result) float64 { return r.p99 }), last, cpu, errors)
		}
	}
	if o.loadAware {
		for _, placement := range o.placements {
			fmt.Printf("%s, %s: the agents' CPU per request %.3f ms\n", placement, modeDefault,
				median(all[placement+modeDefault], func(r result) float64 { return r.agentCPU }))
		}
	}
	if o.external {
		for _, placement := range o.placements {
			fmt.Printf("%s, %s: the external picker's CPU per request %.3f ms, the agents' %.3f ms\n", placement, modeExternal,
				median(all[placement+modeExternal], func(r result) float64 { return r.pickerCPU }),
				median(all[placement+modeExternal], func(r result) float64 { return r.agentCPU }))
		}
	}
	return nil
}

func median(rs []result, f func(result) float64) float64 {
	vs := make([]float64, 0, len(rs))
	for _, r := range rs {
		vs = append(vs, f(r))
	}
	slices.Sort(vs)
	return vs[len(vs)/2]
}

type bench struct {
	*benchenv.Env
	options
	redis  *devredis.Server  // the global limit's store, with -global-rate-limit
	jaeger *devjaeger.Server // the traces' collector, with -tracing
}

// measure sets up one configuration in a folder of its own, loads it at
// the fixed rate, then to saturation, and tears it down.
func (b *bench) measure(name, placement, mode string) (result, error) {
	work := filepath.Join(b.Dir, name)
	var s stack
	var err error
	switch mode {
	case modeBaseline:
		s.url, s.stop, err = b.startBaseline(work, placement, nil)
	case modeBaselineTraced1, modeBaselineTraced100:
		s.url, s.stop, err = b.startBaseline(work, placement, b.baselineTracing(tracedAt[mode]))
	case modeDirect:
		s.url, s.stop, err = b.startReplica()
	default:
		s, err = b.startServemesh(work, placement, mode)
	}
	if err != nil {
		return result{}, err
	}
	defer s.stop()
	l, err := b.loadOf(s.url)
	if err != nil {
		return result{}, err
	}
	defer l.close()
	if err := testutil.Until(60*time.Second, func() bool { return l.saturate() == nil }); err != nil {
		return result{}, fmt.Errorf("n1 never served: %w", err)
	}
	resume := s.pause(b.pause)
	defer resume()
	fixed, _ := withCPU(work, func() loadgen.Stats { return loadgen.FixedRateUntil(l.fixed, b.rate, b.duration) })
	agentsBefore, pickerBefore := processCPU(work, isAgent), s.pickerCPU()
	saturated, cpu := withCPU(work, func() loadgen.Stats { return loadgen.ClosedLoopOf(l.saturate, b.concurrency, b.duration) })
	r := result{rps: saturated.RPS, p50: ms(fixed.P50), p99: ms(fixed.P99), cpu: cpu, errors: fixed.Errors + saturated.Errors}
	if saturated.N > 0 {
		r.agentCPU = (processCPU(work, isAgent) - agentsBefore) * 1000 / float64(saturated.N)
		r.pickerCPU = (s.pickerCPU() - pickerBefore) * 1000 / float64(saturated.N)
	}
	if l.lastTokens != nil {
		r.last99 = ms(l.lastTokens.p99())
	}
	r.firstError = fixed.FirstError + saturated.FirstError
	if _, traced := tracedAt[mode]; traced {
		fmt.Printf("%s (%s): traced %s\n", name, mode, tracedShare(work))
	}
	return r, nil
}

// loadName says what the load sends.
func loadName(p string) string {
	switch p {
	case protoGRPC:
		return "unary gRPC calls (HTTP/2)"
	case protoStream:
		return fmt.Sprintf("HTTP/1.1 GETs of %d streamed tokens (one every %s at the fixed rate, as fast as they come at saturation)", streamTokens, streamEvery)
	}
	return "HTTP/1.1 GETs"
}

// The streams of -protocol stream: streamTokens lines, one every
// streamEvery in the fixed-rate runs (a model generating), all at once in
// the saturation runs.
const (
	streamTokens = 20
	streamEvery  = 10 * time.Millisecond
)

// load is what the runs of one configuration send: fixed makes one
// request of the fixed-rate run and returns when its latency ends (for a
// stream, its first token; the last one's latency goes to lastTokens);
// saturate makes one of the saturation run.
type load struct {
	fixed      func() (time.Time, error)
	saturate   func() error
	close      func()
	lastTokens *latencies
}

// latencies collect durations from concurrent calls.
type latencies struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ds = append(l.ds, d)
	l.mu.Unlock()
}

// p99 is the 99th percentile of what was added, 0 if nothing was.
func (l *latencies) p99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ds) == 0 {
		return 0
	}
	slices.Sort(l.ds)
	return l.ds[min(len(l.ds)-1, len(l.ds)*99/100)]
}

// loadOf is the load the protocol asks for, sent to url: HTTP GETs, unary
// gRPC calls to url's host and port over one HTTP/2 connection, or
// streamed responses.
func (b *bench) loadOf(url string) (load, error) {
	now := func(err error) (time.Time, error) { return time.Now(), err }
	switch b.protocol {
	case protoGRPC:
		target := strings.TrimPrefix(url, "http://")
		target, _, _ = strings.Cut(target, "/")
		g, err := loadgen.NewGRPC(target)
		if err != nil {
			return load{}, err
		}
		return load{fixed: func() (time.Time, error) { return now(g.Check()) }, saturate: g.Check, close: func() { _ = g.Close() }}, nil
	case protoStream:
		paced := fmt.Sprintf("%s?tokens=%d&every_ms=%d", url, streamTokens, streamEvery.Milliseconds())
		burst := fmt.Sprintf("%s?tokens=%d", url, streamTokens)
		fixedClient, client := loadgen.NewClient(256), loadgen.NewClient(b.concurrency)
		l := load{close: func() {}, lastTokens: &latencies{}}
		l.fixed = func() (time.Time, error) {
			start := time.Now()
			s, err := loadgen.Stream(fixedClient, paced, streamTokens)
			if err == nil {
				l.lastTokens.add(s.Last.Sub(start))
			}
			return s.First, err
		}
		l.saturate = func() error {
			_, err := loadgen.Stream(client, burst, streamTokens)
			return err
		}
		return l, nil
	}
	client := loadgen.NewClient(b.concurrency)
	get := func() error { return loadgen.Get(client, url) }
	return load{fixed: func() (time.Time, error) { return now(get()) }, saturate: get, close: func() {}}, nil
}

// replicaArgs run the demo replica the protocol asks for, on listen.
func (b *bench) replicaArgs(listen string) []string {
	args := []string{"demo-replica", "--backend", "bench", "--listen", listen}
	if b.protocol == protoGRPC {
		args = append(args, "--grpc")
	}
	return args
}

// startReplica runs a demo replica alone, to be loaded directly.
func (b *bench) startReplica() (string, func(), error) {
	addr := testutil.MustFreeAddr("127.0.0.1")
	r, err := proc.Start(proc.Spec{Path: b.Bin, Args: b.replicaArgs(addr)})
	if err != nil {
		return "", nil, err
	}
	return "http://" + addr + "/bench", func() { _ = r.Stop(5 * time.Second) }, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// stack is one configuration running: the URL of n1's route, how to stop
// it, and servemesh's daemons, if it runs them.
type stack struct {
	url        string
	stop       func()
	controller *proc.Process
	agents     []*proc.Process
	picker     *devepp.Picker // the external picker, with modeExternal
}

// pickerCPU is the CPU seconds the stack's external picker used (0: none).
func (s stack) pickerCPU() float64 {
	if s.picker == nil || s.picker.Pid() == 0 {
		return 0
	}
	return testutil.CPUSeconds(s.picker.Pid())
}

// pause stops which daemons ("": none) until the returned func resumes
// them; the Envoys and the replica run on.
func (s stack) pause(which string) (resume func()) {
	var ps []*proc.Process
	if (which == "controller" || which == "all") && s.controller != nil {
		ps = append(ps, s.controller)
	}
	if which == "agents" || which == "all" {
		ps = append(ps, s.agents...)
	}
	for _, p := range ps {
		_ = syscall.Kill(p.Pid(), syscall.SIGSTOP) // the daemon alone: its children have process groups of their own
	}
	return func() {
		for _, p := range ps {
			_ = syscall.Kill(p.Pid(), syscall.SIGCONT)
		}
	}
}

// startServemesh runs a controller and two nodes (n1 on 127.0.0.2, n2 on
// 127.0.0.3) and places one replica on n1 (same-node) or n2 (cross-node).
func (b *bench) startServemesh(work, placement, mode string) (stack, error) {
	ctx := context.Background()
	cpus := map[string][]string{sameNode: {"4", "0.5"}, crossNode: {"0.5", "4"}}[placement] // the replica needs 1 CPU
	agentArgs := []string{"--no-access-log=" + strconv.FormatBool(b.noAccessLog)}
	if mode == modeGlobal {
		passwordFile := filepath.Join(b.Dir, "redis-password")
		if err := os.WriteFile(passwordFile, []byte(b.redis.Password), 0o600); err != nil {
			return stack{}, err
		}
		bin, err := ratelimit.Find("")
		if err != nil {
			return stack{}, err
		}
		agentArgs = append(agentArgs, "--rate-limit-redis", b.redis.Addr, "--rate-limit-redis-password-file", passwordFile, "--rate-limit-service", bin)
	}
	var ctlArgs []string
	var picker *devepp.Picker
	if mode == modeExternal {
		ctlArgs = []string{"--allow-replica-cidr", "127.0.0.0/8"} // the picker runs on loopback
		var err error
		if picker, err = devepp.Start(ctx, devepp.Options{Dir: work + "-picker", Consul: "http://" + b.Consul.HTTPAddr, Service: wire.BackendService("bench"),
			Listen: testutil.MustFreeAddr("127.0.0.1")}); err != nil {
			return stack{}, err
		}
	}
	mesh, err := b.StartMesh(benchenv.MeshOptions{Work: work, Plaintext: mode == modePlaintext, NodeCPUs: cpus, AgentArgs: agentArgs, ControllerArgs: ctlArgs})
	if err != nil {
		if picker != nil {
			picker.Stop()
		}
		return stack{}, err
	}
	s := stack{stop: mesh.Stop, controller: mesh.Controller, agents: mesh.Agents}
	if picker != nil {
		s.stop, s.picker = func() { mesh.Stop(); picker.Stop() }, picker
	}
	c := mesh.Client
	spec := &meshspec.ProcessSpec{Command: b.Bin, Args: b.replicaArgs("${HOST}:${PORT}"), HealthPath: "/"}
	endpoint := meshspec.Endpoint{Name: "bench", Route: "/bench", Traffic: map[string]float64{"bench": 1}}
	switch mode {
	case modeLimited:
		endpoint.RateLimit = &meshspec.RateLimit{Local: &meshspec.LocalRateLimit{RequestsPerSecond: b.rateLimit}}
	case modeGlobal:
		endpoint.RateLimit = &meshspec.RateLimit{Global: &meshspec.GlobalRateLimit{Requests: b.globalLimit}}
	}
	protocol := meshspec.ProtocolHTTP1
	if b.protocol == protoGRPC {
		spec.HealthPath, protocol = "", meshspec.ProtocolGRPC // probed with the gRPC health service
		endpoint.Route, endpoint.Methods = "/grpc.health.v1.Health", []string{"POST"}
	}
	config := meshspec.BackendConfig{NumReplicas: 1, CPUs: 1, MaxConcurrentQueries: 1000, LoadAware: loadAware(b.loadAware && mode != modePlaintext && mode != modeExternal)}
	if picker != nil {
		config.EndpointPicker = &meshspec.EndpointPicker{Address: picker.Addr}
	}
	var refused error
	if err := testutil.Until(30*time.Second, func() bool {
		_, refused = c.CreateBackend(ctx, meshspec.BackendSpec{Name: "bench", Process: spec, Protocol: protocol, Config: config})
		return refused == nil
	}); err != nil {
		s.stop()
		return s, fmt.Errorf("create backend (are the agents up?): %w; the last refusal: %w", err, refused)
	}
	if sampling, ok := tracedAt[mode]; ok {
		if _, err := c.SetTracing(ctx, &meshspec.Tracing{Collector: b.jaeger.OTLP, SamplingPercent: &sampling}); err != nil {
			s.stop()
			return s, err
		}
	}
	if _, err := c.CreateEndpoint(ctx, endpoint); err != nil {
		s.stop()
		return s, err
	}
	s.url = "http://" + mesh.Public[0] + "/bench"
	return s, nil
}

// tracedAt is the sampling of the traced modes, in percent.
var tracedAt = map[string]float64{modeTraced1: 1, modeTraced100: 100, modeBaselineTraced1: 1, modeBaselineTraced100: 100}

// baselineTracing traces the hand-written Envoys at sampling percent to
// the bench's Jaeger.
func (b *bench) baselineTracing(sampling float64) *tracedVars {
	host, _, _ := net.SplitHostPort(b.jaeger.OTLP)
	return &tracedVars{Host: host, Port: testutil.Port(b.jaeger.OTLP), Sampling: sampling}
}

// loadAware is the backend's load-aware setting: on, or off (nil).
func loadAware(on bool) *meshspec.LoadAware {
	if on {
		return &meshspec.LoadAware{}
	}
	return nil
}

// withCPU runs load and returns its stats and the CPU milliseconds per
// request the Envoys under work used meanwhile.
func withCPU(work string, load func() loadgen.Stats) (loadgen.Stats, float64) {
	before := envoyCPU(work)
	s := load()
	used := envoyCPU(work) - before
	return s, used * 1000 / float64(max(s.N, 1))
}

// envoyCPU sums the CPU seconds of the Envoys whose bootstrap is under work.
func envoyCPU(work string) float64 {
	return processCPU(work, func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasSuffix(a, "bootstrap.yaml") })
	})
}

// isAgent reports whether a command line is a servemesh agent's.
func isAgent(args []string) bool { return len(args) > 1 && args[1] == "agent" }

// processCPU is the CPU seconds of the processes under work whose command
// lines match.
func processCPU(work string, match func(args []string) bool) float64 {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var sum float64
	for _, path := range procs {
		cmdline, err := os.ReadFile(path)
		if err != nil || !bytes.Contains(cmdline, []byte(work+"/")) || !match(strings.Split(string(cmdline), "\x00")) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err == nil {
			sum += testutil.CPUSeconds(pid)
		}
	}
	return sum
}
