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
	"sync"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/bench/loadgen"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

func main() {
	rate := flag.Int("rate", 1000, "requests per second through Envoy")
	phase := flag.Duration("phase", 10*time.Second, "length of each phase")
	flag.Parse()
	if err := run(*rate, *phase); err != nil {
		fmt.Fprintln(os.Stderr, "statsoverhead:", err)
		os.Exit(1)
	}
}

func run(rate int, phase time.Duration) error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "stats")
	if err != nil {
		return err
	}
	defer be.Close()
	dir, bin := be.Dir, be.Bin
	free := func() string { return testutil.MustFreeAddr("127.0.0.1") }
	replica, xds, cpHTTP, public, mesh, status := free(), free(), free(), free(), free(), free()
	config := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("backends: [{name: b, replicas: [{address: %q}], config: {max_concurrent_queries: 1000}}]\nendpoints: [{name: e, route: /e, traffic: {b: 1}}]\n", replica)), 0o644); err != nil {
		return err
	}
	env := be.Vars()
	for _, args := range [][]string{
		{"demo-replica", "--backend", "b", "--listen", replica},
		{"serve", "--config", config, "--xds-listen", xds, "--http-listen", cpHTTP},
	} {
		p, err := start(env, bin, args...)
		if err != nil {
			return err
		}
		defer stop(p)
	}
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	proxy, err := envoy.Launcher{WorkDir: dir, Concurrency: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Bootstrap: bootstrap.Options{Node: wire.ProxyNode{ID: "stats", PublicAddress: "127.0.0.1", PublicPort: testutil.Port(public),
			MeshAddress: "127.0.0.1", MeshPort: testutil.Port(mesh)}, XDSAddress: xds}}.StartReady(readyCtx)
	if err != nil {
		return err
	}
	defer func() { _ = proxy.Stop(ctx, 0) }()
	agentProc, err := start(env, bin, "agent", "--plaintext", "--stop-on-exit", "--no-envoy", "--node-id", "stats", "--admin-socket", envoy.AdminSocketIn(dir), "--metrics-listen", status,
		"--work-dir", filepath.Join(dir, "agent"))
	if err != nil {
		return err
	}
	defer stop(agentProc)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	if err := waitOK(client, "http://"+public+"/e"); err != nil {
		return err
	}
	if err := waitOK(client, "http://"+status+"/v1/load"); err != nil {
		return err
	}

	fmt.Printf("Envoy (1 worker thread) serving %d req/s; each phase %s; CPU as %% of one core\n\n", rate, phase)
	fmt.Println("| /v1/load polled | Envoy CPU | agent CPU | requests failed |")
	fmt.Println("|---|---:|---:|---:|")
	for _, every := range []time.Duration{0, time.Second, 100 * time.Millisecond} {
		envoyCPU, agentCPU, failed := measure(client, "http://"+public+"/e", "http://"+status+"/v1/load", rate, phase, every, proxy.Pid(), agentProc.Pid())
		label := "never"
		if every > 0 {
			label = "every " + every.String()
		}
		fmt.Printf("| %s | %.1f%% | %.2f%% | %d |\n", label, envoyCPU, agentCPU, failed)
	}
	return nil
}

// measure drives rate requests a second for d while polling loadURL every
// poll (never when 0), and returns Envoy's and the agent's CPU share.
func measure(client *http.Client, url, loadURL string, rate int, d, poll time.Duration, envoyPid, agentPid int) (float64, float64, int) {
	e0, a0 := testutil.CPUSeconds(envoyPid), testutil.CPUSeconds(agentPid)
	start := time.Now()
	var failed int
	var mu sync.Mutex
	var wg sync.WaitGroup
	stopPoll := make(chan struct{})
	if poll > 0 {
		go func() {
			tick := time.NewTicker(poll)
			defer tick.Stop()
			for {
				select {
				case <-stopPoll:
					return
				case <-tick.C:
					_ = loadgen.Get(client, loadURL)
				}
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	total := int(d / interval)
	sem := make(chan struct{}, 64)
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if loadgen.Get(client, url) != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stopPoll)
	elapsed := time.Since(start).Seconds()
	return (testutil.CPUSeconds(envoyPid) - e0) / elapsed * 100, (testutil.CPUSeconds(agentPid) - a0) / elapsed * 100, failed
}

func waitOK(c *http.Client, url string) error {
	deadline := time.Now().Add(20 * time.Second)
	for loadgen.Get(c, url) != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering", url)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func start(env []string, bin string, args ...string) (*proc.Process, error) {
	return proc.Start(proc.Spec{Path: bin, Args: args, Env: append(os.Environ(), env...)})
}

func stop(p *proc.Process) { _ = p.Kill() }
