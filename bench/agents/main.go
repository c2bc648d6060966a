package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agents:", err)
		os.Exit(1)
	}
}

// start runs a servemesh child with env added to this process's.
func start(env []string, bin string, args ...string) (*proc.Process, error) {
	return proc.Start(proc.Spec{Path: bin, Args: args, Env: append(os.Environ(), env...)})
}

func run() error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "agents")
	if err != nil {
		return err
	}
	defer be.Close()
	dir, bin, consul, env := be.Dir, be.Bin, be.Consul, be.Vars()
	apiAddr, xdsAddr := testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1")
	ctlProc, err := start(env, bin, "controller", "--plaintext", "--allow-replica-cidr", "127.0.0.0/8", "--api-listen", apiAddr, "--xds-listen", xdsAddr, "--drain-grace", "1s")
	if err != nil {
		return err
	}
	defer func() { _ = ctlProc.Stop(15 * time.Second) }()
	c := api.NewClient(apiAddr, "")
	if err := testutil.Until(20*time.Second, func() bool { i, err := c.Leader(ctx); return err == nil && i.Leading }); err != nil {
		return err
	}
	for i, addr := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		p, err := start(env, bin, "agent", "--plaintext", "--stop-on-exit", "--node-id", fmt.Sprintf("n%d", i+1), "--address", addr, "--cpus", "4",
			"--xds", xdsAddr, "--public", testutil.MustFreeAddr(addr), "--mesh", testutil.MustFreeAddr("127.0.0.1"),
			"--work-dir", filepath.Join(dir, fmt.Sprintf("n%d", i+1)), "--drain-grace", "1s", "--allow-command", bin)
		if err != nil {
			return err
		}
		defer func() { _ = p.Stop(15 * time.Second) }()
	}
	spec := &meshspec.ProcessSpec{Command: bin, Args: []string{"demo-replica", "--backend", "a", "--listen", "${HOST}:${PORT}"}, HealthPath: "/"}
	if err := testutil.Until(30*time.Second, func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "a", Process: spec, Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}})
		return err == nil
	}); err != nil {
		return fmt.Errorf("create backend (are the agents up?): %w", err)
	}
	if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 1}}); err != nil {
		return err
	}
	stats := envoy.Admin{Socket: envoy.AdminSocketIn(filepath.Join(dir, "n1"))}
	healthy := func() int {
		s, err := stats.Stats(ctx, `^cluster\.a\.membership_healthy$`)
		if err != nil {
			return -1
		}
		return int(s["cluster.a.membership_healthy"])
	}
	if err := testutil.Until(30*time.Second, func() bool { return healthy() == 1 }); err != nil {
		return fmt.Errorf("first replica never served: %w", err)
	}

	fmt.Println("| measurement | n | p50 | max |")
	fmt.Println("|---|---:|---:|---:|")
	var scaleUp []time.Duration
	for range 5 {
		six, one := 6, 1
		start := time.Now()
		if _, err := c.UpdateBackend(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &six}); err != nil {
			return err
		}
		if err := testutil.Until(30*time.Second, func() bool { return healthy() == 6 }); err != nil {
			return fmt.Errorf("scale-up: %w", err)
		}
		scaleUp = append(scaleUp, time.Since(start))
		if _, err := c.UpdateBackend(ctx, "a", meshspec.BackendConfigPatch{NumReplicas: &one}); err != nil {
			return err
		}
		if err := testutil.Until(30*time.Second, func() bool { b, _ := c.GetBackend(ctx, "a"); return len(b.Placements) == 1 && healthy() == 1 }); err != nil {
			return fmt.Errorf("scale-down: %w", err)
		}
	}
	row("backend update num_replicas 1 -> 6: call to all 6 healthy in Envoy (3 nodes)", scaleUp)

	// A hung replica (SIGSTOP): until Envoy no longer counts it healthy.
	var hung []time.Duration
	client, _ := consul.Client()
	for range 5 {
		entries, _, err := client.Health().Service("a", "", true, nil)
		if err != nil {
			return fmt.Errorf("list replicas: %w", err)
		}
		if len(entries) == 0 {
			return fmt.Errorf("no replica to hang")
		}
		addr := fmt.Sprintf("%s:%d", entries[0].Service.Address, entries[0].Service.Port)
		pid := testutil.PidListening(addr)
		start := time.Now()
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		if err := testutil.Until(30*time.Second, func() bool { return healthy() == 0 }); err != nil {
			return fmt.Errorf("hung replica still healthy: %w", err)
		}
		hung = append(hung, time.Since(start))
		_ = syscall.Kill(pid, syscall.SIGCONT)
		if err := testutil.Until(30*time.Second, func() bool { return healthy() == 1 }); err != nil {
			return fmt.Errorf("replica did not come back: %w", err)
		}
	}
	row("replica hangs (SIGSTOP) -> Envoy stops routing to it (probe every 1s, 1s timeout)", hung)

	return registrationLoad(ctx, client, c, ctlProc.Pid())
}

// registrationLoad registers 1,000 instances of 100 external services and
// measures the controller's memory and CPU idle and while 20 instances a
// second change health.
func registrationLoad(ctx context.Context, client *consulapi.Client, c *api.Client, pid int) error {
	for s := range 100 {
		svc := fmt.Sprintf("ext-%d", s)
		for i := range 10 {
			id := fmt.Sprintf("%s-%d", svc, i)
			if err := client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: id, Name: svc,
				Address: "10.1." + strconv.Itoa(s) + "." + strconv.Itoa(i+1), Port: 8080,
				Check: &consulapi.AgentServiceCheck{CheckID: id, TTL: "1h", Status: consulapi.HealthPassing}}); err != nil {
				return err
			}
		}
		if _, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: svc, External: &meshspec.ExternalSpec{Service: svc}}); err != nil {
			return err
		}
		if _, err := c.CreateEndpoint(ctx, meshspec.Endpoint{Name: svc, Route: "/" + svc, Traffic: map[string]float64{svc: 1}}); err != nil {
			return err
		}
	}
	time.Sleep(3 * time.Second)
	_, cpu0 := usage(pid)
	time.Sleep(10 * time.Second)
	rss1, cpu1 := usage(pid)
	fmt.Printf("\ncontroller with 1,000 replicas registered (100 external backends x 10), idle 10 s: RSS %d MiB, CPU %.1f%% of one core\n",
		rss1/1024, (cpu1-cpu0)/10*100)
	stop := time.Now().Add(10 * time.Second)
	flips := 0
	for time.Now().Before(stop) {
		for k := range 20 {
			id := fmt.Sprintf("ext-%d-%d", (flips+k)%100, (flips/100+k)%10)
			status := consulapi.HealthCritical
			if flips%2 == 0 {
				status = consulapi.HealthPassing
			}
			_ = client.Agent().UpdateTTL(id, "", status)
		}
		flips++
		time.Sleep(time.Second)
	}
	rss2, cpu2 := usage(pid)
	fmt.Printf("same, while 20 instances a second change health for 10 s: RSS %d MiB, CPU %.1f%% of one core\n", rss2/1024, (cpu2-cpu1)/10*100)
	return nil
}

// usage returns a process's RSS in KiB and CPU seconds used so far.
func usage(pid int) (int, float64) {
	return int(testutil.RSSMiB(pid) * 1024), testutil.CPUSeconds(pid)
}

func row(what string, lat []time.Duration) {
	slices.Sort(lat)
	fmt.Printf("| %s | %d | %s | %s |\n", what, len(lat), lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}
