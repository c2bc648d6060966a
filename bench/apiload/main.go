package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	nodes := flag.Int("nodes", 3000, "xDS node ids that connect once")
	mixed := flag.Duration("mixed", 5*time.Second, "how long the mixed load runs")
	flag.Parse()
	if err := run(*nodes, *mixed); err != nil {
		fmt.Fprintln(os.Stderr, "apiload:", err)
		os.Exit(1)
	}
}

// bench is one controller on one Consul.
type bench struct {
	ctl      *proc.Process
	api, xds string
	client   *api.Client
}

func run(nodes int, mixed time.Duration) error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "api")
	if err != nil {
		return err
	}
	defer be.Close()
	b := &bench{api: testutil.MustFreeAddr("127.0.0.1"), xds: testutil.MustFreeAddr("127.0.0.1")}
	b.ctl, err = proc.Start(proc.Spec{Path: be.Bin, Args: []string{"controller", "--plaintext", "--allow-replica-cidr", "127.0.0.0/8", "--api-listen", b.api, "--xds-listen", b.xds},
		Env: append(os.Environ(), append(be.Vars(), "SERVEMESH_LOG_LEVEL=warn")...)})
	if err != nil {
		return err
	}
	defer func() { _ = b.ctl.Stop(10 * time.Second) }()
	b.client = api.NewClient(b.api, "")
	if err := testutil.Until(20*time.Second, func() bool { info, err := b.client.Leader(ctx); return err == nil && info.Leading }); err != nil {
		return fmt.Errorf("the controller did not lead: %w", err)
	}
	fmt.Println("| measurement | n | p50 | p99 | max | notes |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
	for _, n := range []int{1000, 10000, 25000} {
		if err := b.applyTimes(ctx, n); err != nil {
			return err
		}
	}
	if err := b.readsDuringApply(ctx, 25000); err != nil {
		return err
	}
	if err := b.mixedLoad(ctx, 16, mixed); err != nil {
		return err
	}
	return b.nodeMemory(ctx, nodes)
}

// endpoints is a model of n headless endpoints on one backend, named with
// prefix.
func endpoints(n int, prefix string) *meshspec.Model {
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "b", Replicas: []meshspec.Replica{{Address: "127.0.0.1:9"}}}}}
	for i := range n {
		m.Endpoints = append(m.Endpoints, meshspec.Endpoint{Name: fmt.Sprintf("%s%d", prefix, i), Traffic: map[string]float64{"b": 1}})
	}
	return m
}

// applyTimes times an apply that creates n endpoints, then one that
// replaces them all (n deletions and n creations), then one back to none.
func (b *bench) applyTimes(ctx context.Context, n int) error {
	for _, step := range []struct {
		what string
		m    *meshspec.Model
	}{
		{fmt.Sprintf("apply: create %d endpoints", n), endpoints(n, "e")},
		{fmt.Sprintf("apply: replace %d endpoints with %d others", n, n), endpoints(n, "f")},
		{fmt.Sprintf("apply: delete %d endpoints", n), endpoints(0, "")},
	} {
		start := time.Now()
		if _, err := b.client.Apply(ctx, meshspec.SpecOf(step.m), api.ApplyOptions{}); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
		took := time.Since(start)
		fmt.Printf("| %s | 1 | %s | | | %.1f µs per object |\n", step.what, ms(took), float64(took.Microseconds())/float64(max(n, 1)))
	}
	return nil
}

// readsDuringApply measures 8 readers with no write, then the same readers
// while an apply of n endpoints runs.
func (b *bench) readsDuringApply(ctx context.Context, n int) error {
	reads := func(stop <-chan struct{}, until time.Duration) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		deadline := time.Now().Add(until)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					if _, err := b.client.Leader(ctx); err != nil {
						continue
					}
					mu.Lock()
					lat = append(lat, time.Since(start))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return lat
	}
	row("GET /v1/leader, 8 clients, no write (baseline)", reads(nil, 2*time.Second), "")
	stop := make(chan struct{})
	var lat []time.Duration
	done := make(chan struct{})
	go func() { lat = reads(stop, 5*time.Minute); close(done) }()
	start := time.Now()
	_, err := b.client.Apply(ctx, meshspec.SpecOf(endpoints(n, "g")), api.ApplyOptions{})
	took := time.Since(start)
	close(stop)
	<-done
	if err != nil {
		return err
	}
	row(fmt.Sprintf("GET /v1/leader, 8 clients, during an apply of %d endpoints", n), lat, fmt.Sprintf("the apply took %s", ms(took)))
	_, err = b.client.Apply(ctx, meshspec.SpecOf(endpoints(0, "")), api.ApplyOptions{})
	return err
}

// mixedLoad runs clients that each send 9 reads (leader, list endpoints of
// a small state, status) for every write (a traffic flip) for d.
func (b *bench) mixedLoad(ctx context.Context, clients int, d time.Duration) error {
	m := endpoints(50, "m")
	m.Backends = append(m.Backends, meshspec.Backend{Name: "c", Replicas: []meshspec.Replica{{Address: "127.0.0.1:10"}}})
	if _, err := b.client.Apply(ctx, meshspec.SpecOf(m), api.ApplyOptions{}); err != nil {
		return err
	}
	var mu sync.Mutex
	var reads, writes []time.Duration
	var failed atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				start := time.Now()
				var err error
				write := i%10 == 9
				switch {
				case write:
					w := rand.Float64()
					_, err = b.client.SetTraffic(ctx, fmt.Sprintf("m%d", (c*7+i)%50), map[string]float64{"b": w, "c": 1 - w})
				case i%3 == 0:
					_, err = b.client.ListEndpoints(ctx)
				case i%3 == 1:
					_, err = b.client.Status(ctx)
				default:
					_, err = b.client.Leader(ctx)
				}
				took := time.Since(start)
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				if write {
					writes = append(writes, took)
				} else {
					reads = append(reads, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	secs := d.Seconds()
	row(fmt.Sprintf("mixed load, %d clients: reads", clients), reads, fmt.Sprintf("%.0f/s", float64(len(reads))/secs))
	row(fmt.Sprintf("mixed load, %d clients: writes (set traffic)", clients), writes, fmt.Sprintf("%.0f/s; %d calls failed", float64(len(writes))/secs, failed.Load()))
	_, err := b.client.Apply(ctx, meshspec.SpecOf(endpoints(0, "")), api.ApplyOptions{})
	return err
}

func row(what string, lat []time.Duration, notes string) {
	if len(lat) == 0 {
		fmt.Printf("| %s | 0 | | | | %s |\n", what, notes)
		return
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("| %s | %d | %s | %s | %s | %s |\n", what, len(lat), ms(q(0.5)), ms(q(0.99)), ms(lat[len(lat)-1]), notes)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
