package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

func main() {
	rate := flag.Int("rate", 1000, "requests per second for the fixed-rate runs")
	duration := flag.Duration("duration", 10*time.Second, "length of each run")
	concurrency := flag.Int("concurrency", 32, "concurrent connections for the saturation runs")
	envoyThreads := flag.Int("envoy-concurrency", 1, "Envoy worker threads")
	flag.Parse()
	if err := run(*rate, *duration, *concurrency, *envoyThreads); err != nil {
		fmt.Fprintln(os.Stderr, "dataplane:", err)
		os.Exit(1)
	}
}

func run(rate int, duration time.Duration, concurrency, envoyThreads int) error {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, err := os.MkdirTemp("", "servemesh-bench")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bin, err := testutil.BuildServemesh(context.Background(), dir)
	if err != nil {
		return err
	}
	replica, xds, cpHTTP, public, mesh := testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1")
	config := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
backends: [{name: bench, replicas: [{address: "%s"}], config: {max_concurrent_queries: 1000}}]
endpoints: [{name: bench, route: /bench, traffic: {bench: 1}}]
`, replica)), 0o644); err != nil {
		return err
	}
	stopReplica, err := startChild(bin, "demo-replica", "--backend", "bench", "--listen", replica)
	if err != nil {
		return err
	}
	defer stopReplica()
	stopCP, err := startChild(bin, "serve", "--config", config, "--xds-listen", xds, "--http-listen", cpHTTP)
	if err != nil {
		return err
	}
	defer stopCP()

	binary, err := envoy.Find("")
	if err != nil {
		return err
	}
	version, err := envoy.CheckVersion(context.Background(), binary)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := envoy.Launcher{Binary: binary, WorkDir: dir, Concurrency: envoyThreads, Logger: log, Bootstrap: bootstrap.Options{
		Node:       wire.ProxyNode{ID: "bench", PublicAddress: "127.0.0.1", PublicPort: testutil.Port(public), MeshAddress: "127.0.0.1", MeshPort: testutil.Port(mesh)},
		XDSAddress: xds,
	}}
	envoyProc, err := node.StartReady(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = envoyProc.Stop(context.Background(), 0) }()
	direct, viaEnvoy := "http://"+replica+"/bench", "http://"+public+"/bench"
	if err := loadgen.WaitServing(viaEnvoy); err != nil {
		return err
	}

	fmt.Printf("machine: %d CPUs (%s/%s), Go %s, Envoy %s with %d worker thread(s); each run %s\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), version, envoyThreads, duration)
	fmt.Println("| run | target | requests | errors | req/s | p50 | p99 | p99.9 |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	type pair struct{ direct, envoy loadgen.Stats }
	var fixed, saturated pair
	for _, r := range []struct {
		name   string
		target string
		out    *loadgen.Stats
		load   func(string) loadgen.Stats
	}{
		{fmt.Sprintf("fixed %d req/s", rate), "direct", &fixed.direct, func(u string) loadgen.Stats { return loadgen.FixedRate(u, rate, duration) }},
		{fmt.Sprintf("fixed %d req/s", rate), "via Envoy", &fixed.envoy, func(u string) loadgen.Stats { return loadgen.FixedRate(u, rate, duration) }},
		{fmt.Sprintf("saturation, %d connections", concurrency), "direct", &saturated.direct, func(u string) loadgen.Stats { return loadgen.ClosedLoop(u, concurrency, duration) }},
		{fmt.Sprintf("saturation, %d connections", concurrency), "via Envoy", &saturated.envoy, func(u string) loadgen.Stats { return loadgen.ClosedLoop(u, concurrency, duration) }},
	} {
		url := direct
		if r.target == "via Envoy" {
			url = viaEnvoy
		}
		*r.out = r.load(url)
		s := *r.out
		fmt.Printf("| %s | %s | %d | %d | %.0f | %s | %s | %s |\n", r.name, r.target, s.N, s.Errors, s.RPS, loadgen.MS(s.P50), loadgen.MS(s.P99), loadgen.MS(s.P999))
	}
	fmt.Printf("\nfixed rate: Envoy adds %s at p50 and %s at p99\n", loadgen.MS(fixed.envoy.P50-fixed.direct.P50), loadgen.MS(fixed.envoy.P99-fixed.direct.P99))
	fmt.Printf("saturation: throughput via Envoy / direct = %.2f; p50 ratio %.2f\n",
		saturated.envoy.RPS/saturated.direct.RPS, float64(saturated.envoy.P50)/float64(saturated.direct.P50))
	return nil
}

func startChild(bin string, args ...string) (func(), error) {
	p, err := proc.Start(proc.Spec{Path: bin, Args: args})
	if err != nil {
		return nil, err
	}
	return func() { _ = p.Kill() }, nil
}
