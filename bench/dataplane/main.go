package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

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
	replica, xds, cpHTTP, public, mesh, admin := testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1")
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
		XDSAddress: xds, AdminAddress: admin,
	}}
	envoyProc, err := node.StartReady(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = envoyProc.Stop(context.Background(), 0) }()
	direct, viaEnvoy := "http://"+replica+"/bench", "http://"+public+"/bench"
	if err := waitServing(viaEnvoy); err != nil {
		return err
	}

	fmt.Printf("machine: %d CPUs (%s/%s), Go %s, Envoy %s with %d worker thread(s); each run %s\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), version, envoyThreads, duration)
	fmt.Println("| run | target | requests | errors | req/s | p50 | p99 | p99.9 |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	type pair struct{ direct, envoy stats }
	var fixed, saturated pair
	for _, r := range []struct {
		name   string
		target string
		out    *stats
		load   func(string) stats
	}{
		{fmt.Sprintf("fixed %d req/s", rate), "direct", &fixed.direct, func(u string) stats { return fixedRate(u, rate, duration) }},
		{fmt.Sprintf("fixed %d req/s", rate), "via Envoy", &fixed.envoy, func(u string) stats { return fixedRate(u, rate, duration) }},
		{fmt.Sprintf("saturation, %d connections", concurrency), "direct", &saturated.direct, func(u string) stats { return closedLoop(u, concurrency, duration) }},
		{fmt.Sprintf("saturation, %d connections", concurrency), "via Envoy", &saturated.envoy, func(u string) stats { return closedLoop(u, concurrency, duration) }},
	} {
		url := direct
		if r.target == "via Envoy" {
			url = viaEnvoy
		}
		*r.out = r.load(url)
		s := *r.out
		fmt.Printf("| %s | %s | %d | %d | %.0f | %s | %s | %s |\n", r.name, r.target, s.n, s.errors, s.rps, ms(s.p50), ms(s.p99), ms(s.p999))
	}
	fmt.Printf("\nfixed rate: Envoy adds %s at p50 and %s at p99\n", ms(fixed.envoy.p50-fixed.direct.p50), ms(fixed.envoy.p99-fixed.direct.p99))
	fmt.Printf("saturation: throughput via Envoy / direct = %.2f; p50 ratio %.2f\n",
		saturated.envoy.rps/saturated.direct.rps, float64(saturated.envoy.p50)/float64(saturated.direct.p50))
	return nil
}

type stats struct {
	n, errors      int
	rps            float64
	p50, p99, p999 time.Duration
}

func summarize(lat []time.Duration, errors int, elapsed time.Duration) stats {
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	return stats{n: len(lat) + errors, errors: errors, rps: float64(len(lat)) / elapsed.Seconds(), p50: q(0.5), p99: q(0.99), p999: q(0.999)}
}

func newClient(conns int) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}
}

func get(c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// fixedRate sends rate requests per second on schedule; each latency runs
// from the request's scheduled time to its response.
func fixedRate(url string, rate int, d time.Duration) stats {
	const workers = 256
	client := newClient(workers)
	total := int(d.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	jobs := make(chan time.Time, total)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, total)
	errors := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for due := range jobs {
				time.Sleep(time.Until(due))
				err := get(client, url)
				l := time.Since(due)
				mu.Lock()
				if err != nil {
					errors++
				} else {
					lat = append(lat, l)
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for i := range total {
		jobs <- start.Add(time.Duration(i) * interval)
	}
	close(jobs)
	wg.Wait()
	return summarize(lat, errors, time.Since(start))
}

// closedLoop runs conns connections that each send the next request as soon
// as the last one is answered.
func closedLoop(url string, conns int, d time.Duration) stats {
	client := newClient(conns)
	var mu sync.Mutex
	var lat []time.Duration
	errors := 0
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			errs := 0
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := get(client, url); err != nil {
					errs++
					continue
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errors += errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	return summarize(lat, errors, time.Since(start))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

func startChild(bin string, args ...string) (func(), error) {
	p, err := proc.Start(proc.Spec{Path: bin, Args: args})
	if err != nil {
		return nil, err
	}
	return func() { _ = p.Kill() }, nil
}

func waitServing(url string) error {
	deadline := time.Now().Add(15 * time.Second)
	c := newClient(1)
	for {
		if err := get(c, url); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s not serving: %w", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
