// Package main measures what mTLS between nodes costs: requests enter node
// n1's Envoy and are served by a replica on node n2, once in plaintext (n1's
// Envoy calls the replica directly) and once with mTLS (n1's Envoy calls
// n2's inbound listener over mTLS, which forwards to the replica on
// loopback), in one run against the real Consul and Envoy. It reports
// latency, throughput and the CPU both Envoys use per request.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/internal/testutil"
)

func main() {
	rate := flag.Int("rate", 500, "requests per second for the fixed-rate runs")
	duration := flag.Duration("duration", 10*time.Second, "length of each run")
	concurrency := flag.Int("concurrency", 16, "concurrent connections for the saturation runs")
	flag.Parse()
	if err := run(*rate, *duration, *concurrency); err != nil {
		fmt.Fprintln(os.Stderr, "mtlshop:", err)
		os.Exit(1)
	}
}

// result is one mode's runs.
type result struct {
	fixed, saturated       loadgen.Stats
	fixedCPU, saturatedCPU float64 // Envoy CPU milliseconds per request
}

func run(rate int, duration time.Duration, concurrency int) error {
	be, err := benchenv.Start(context.Background(), "mtls")
	if err != nil {
		return err
	}
	defer be.Close()
	b := &bench{Env: be}
	results := map[string]result{}
	for _, mode := range []string{"plaintext", "mtls"} {
		r, err := b.measure(mode, rate, duration, concurrency)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		results[mode] = r
	}
	fmt.Printf("each run %s; Envoy CPU is both nodes' Envoys, in ms per request\n\n", duration)
	fmt.Println("| run | between nodes | requests | errors | req/s | p50 | p99 | p99.9 | Envoy CPU/request |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, run := range []string{"fixed", "saturation"} {
		for _, mode := range []string{"plaintext", "mtls"} {
			r := results[mode]
			s, cpu, name := r.fixed, r.fixedCPU, fmt.Sprintf("fixed %d req/s", rate)
			if run == "saturation" {
				s, cpu, name = r.saturated, r.saturatedCPU, fmt.Sprintf("saturation, %d connections", concurrency)
			}
			fmt.Printf("| %s | %s | %d | %d | %.0f | %s | %s | %s | %.3f ms |\n", name, mode, s.N, s.Errors, s.RPS,
				loadgen.MS(s.P50), loadgen.MS(s.P99), loadgen.MS(s.P999), cpu)
			if s.Errors > 0 {
				defer fmt.Printf("first error (%s, %s): %s\n", name, mode, s.FirstError)
			}
		}
	}
	p, m := results["plaintext"], results["mtls"]
	fmt.Printf("\nfixed rate: mTLS adds %s at p50 and %s at p99, and %.3f ms of Envoy CPU per request\n",
		loadgen.MS(m.fixed.P50-p.fixed.P50), loadgen.MS(m.fixed.P99-p.fixed.P99), m.fixedCPU-p.fixedCPU)
	fmt.Printf("saturation: throughput mTLS / plaintext = %.2f\n", m.saturated.RPS/p.saturated.RPS)
	return nil
}

type bench struct{ *benchenv.Env }

// measure runs a controller and two nodes in mode, places the replica on
// n2, and loads n1's public listener.
func (b *bench) measure(mode string, rate int, duration time.Duration, concurrency int) (result, error) {
	ctx := context.Background()
	work := filepath.Join(b.Dir, mode)
	plaintext := "--plaintext=" + strconv.FormatBool(mode == "plaintext")
	apiAddr, xdsAddr := testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1")
	ctl, err := b.Run("controller", plaintext, "--insecure-consul", "--allow-replica-cidr", "127.0.0.0/8", "--consul-prefix", "bench-"+mode, "--api-listen", apiAddr, "--xds-listen", xdsAddr)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = ctl.Stop(15 * time.Second) }()
	var public string
	for i, node := range []struct {
		addr, cpus string
	}{{"127.0.0.2", "0.5"}, {"127.0.0.3", "4"}} { // the replica needs 1 CPU: only n2 has it
		id := fmt.Sprintf("n%d", i+1)
		pub := testutil.MustFreeAddr(node.addr)
		if i == 0 {
			public = pub
		}
		p, err := b.Run("agent", plaintext, "--insecure-consul", "--consul-prefix", "bench-"+mode, "--node-id", mode+"-"+id, "--address", node.addr,
			"--cpus", node.cpus, "--xds", xdsAddr, "--public", pub, "--mesh", testutil.MustFreeAddr("127.0.0.1"),
			"--inbound", testutil.MustFreeAddr(node.addr),
			"--work-dir", filepath.Join(work, id), "--allow-command", b.Bin, "--concurrency", "1")
		if err != nil {
			return result{}, err
		}
		defer func() { _ = p.Stop(15 * time.Second) }()
	}
	c := api.NewClient(apiAddr, "")
	spec := &model.ProcessSpec{Command: b.Bin, Args: []string{"demo-replica", "--backend", "bench", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}
	if err := testutil.Until(30*time.Second, func() bool {
		_, err := c.CreateBackend(ctx, model.BackendSpec{Name: "bench", Process: spec,
			Config: model.BackendConfig{NumReplicas: 1, CPUs: 1, MaxConcurrentQueries: 1000}})
		return err == nil
	}); err != nil {
		return result{}, fmt.Errorf("create backend (are the agents up?): %w", err)
	}
	if _, err := c.CreateEndpoint(ctx, model.Endpoint{Name: "bench", Route: "/bench", Traffic: map[string]float64{"bench": 1}}); err != nil {
		return result{}, err
	}
	url := "http://" + public + "/bench"
	if err := testutil.Until(60*time.Second, func() bool { return loadgen.Get(loadgen.NewClient(1), url) == nil }); err != nil {
		return result{}, fmt.Errorf("n1 never served: %w", err)
	}
	var r result
	r.fixed, r.fixedCPU = withCPU(work, func() loadgen.Stats { return loadgen.FixedRate(url, rate, duration) })
	r.saturated, r.saturatedCPU = withCPU(work, func() loadgen.Stats { return loadgen.ClosedLoop(url, concurrency, duration) })
	return r, nil
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
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var sum float64
	for _, path := range procs {
		cmdline, err := os.ReadFile(path)
		if err != nil || !bytes.Contains(cmdline, []byte(work)) || !bytes.Contains(cmdline, []byte("bootstrap.yaml")) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err == nil {
			sum += testutil.CPUSeconds(pid)
		}
	}
	return sum
}
