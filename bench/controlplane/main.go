package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/modelgen"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

func main() {
	flips := flag.Int("flips", 100, "set-traffic calls to time")
	commits := flag.Int("commits", 200, "checkpoint writes to time")
	flag.Parse()
	if err := run(*flips, *commits); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run(flips, commits int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "servemesh-bench-cp")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	consul, err := testutil.StartConsul(dir)
	if err != nil {
		return err
	}
	defer consul.Stop()
	client, err := consul.Client()
	if err != nil {
		return err
	}

	fmt.Println("| measurement | n | p50 | p99 | max |")
	fmt.Println("|---|---:|---:|---:|---:|")

	// Checkpoint writes: one backend per commit, as an operation writes.
	st := store.NewConsul(client, "bench-commits", slog.New(slog.DiscardHandler))
	var rev store.Revision
	var lat []time.Duration
	for i := range commits {
		b := meshspec.Backend{Name: fmt.Sprintf("b%d", i), Replicas: []meshspec.Replica{{Address: "10.0.0.1:80"}}}
		start := time.Now()
		if rev, err = st.Commit(ctx, rev, store.Change{PutBackends: []meshspec.Backend{b}}); err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
	}
	row("checkpoint write (one object, Consul transaction with CAS)", lat)

	// Recovery: 1,000 backends and 1,000 endpoints stored, then Lead().
	big := modelgen.Model(1000, 1, 3)
	big.Endpoints = big.Endpoints[:1000]
	bigStore := store.NewConsul(client, "bench-recovery", slog.New(slog.DiscardHandler))
	if _, err := bigStore.Commit(ctx, 0, store.Diff(&meshspec.Model{}, big)); err != nil {
		return err
	}
	lat = lat[:0]
	for range 5 {
		ctl := controller.New(controller.Options{
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: bigStore,
			Publish: func(m *meshspec.Model, _ meshspec.Revision, _ meshspec.Touched) error {
				dp, err := ir.Lower(m, nil, ir.Options{})
				if err != nil {
					return err
				}
				_, err = translate.Shared(dp, nil)
				return err
			},
		})
		start := time.Now()
		if err := ctl.Lead(ctx, "bench"); err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
	}
	row(fmt.Sprintf("recovery: load + validate + translate %d backends, %d endpoints", len(big.Backends), len(big.Endpoints)), lat)

	// Set-traffic to served: a controller process, a real Envoy, two replicas.
	return setTrafficToServed(ctx, dir, consul.HTTPAddr, flips)
}

func setTrafficToServed(ctx context.Context, dir, consulAddr string, flips int) error {
	bin, err := testutil.BuildServemesh(ctx, dir)
	if err != nil {
		return err
	}
	apiAddr, xdsAddr, public, mesh := testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1"), testutil.MustFreeAddr("127.0.0.1")
	ctl, err := proc.Start(proc.Spec{Path: bin, Args: []string{"controller", "--plaintext", "--allow-replica-cidr", "127.0.0.0/8", "--api-listen", apiAddr, "--xds-listen", xdsAddr},
		Env: append(os.Environ(), "CONSUL_HTTP_ADDR="+consulAddr)})
	if err != nil {
		return err
	}
	defer func() { _ = ctl.Kill() }()
	c := api.NewClient(apiAddr, "")
	if err := testutil.Until(20*time.Second, func() bool { info, err := c.Leader(ctx); return err == nil && info.Leading }); err != nil {
		return fmt.Errorf("controller did not lead: %w", err)
	}
	var backends []meshspec.Backend
	for _, name := range []string{"a", "b"} {
		addr, stop, err := replica(name)
		if err != nil {
			return err
		}
		defer stop()
		backends = append(backends, meshspec.Backend{Name: name, Replicas: []meshspec.Replica{{Address: addr}}})
	}
	if _, err := c.Apply(ctx, meshspec.SpecOf(&meshspec.Model{Backends: backends,
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"a": 1}}}}), api.ApplyOptions{}); err != nil {
		return err
	}
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	envoyProc, err := envoy.Launcher{WorkDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Bootstrap: bootstrap.Options{
		Node:       wire.ProxyNode{ID: "bench", PublicAddress: "127.0.0.1", PublicPort: testutil.Port(public), MeshAddress: "127.0.0.1", MeshPort: testutil.Port(mesh)},
		XDSAddress: xdsAddr,
	}}.StartReady(readyCtx)
	if err != nil {
		return err
	}
	defer func() { _ = envoyProc.Stop(ctx, 0) }()
	httpc := &http.Client{Timeout: 5 * time.Second}
	backendOf := func() string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+public+"/svc", nil)
		resp, err := httpc.Do(req)
		if err != nil {
			return ""
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.Header.Get(demoreplica.BackendHeader)
	}
	if err := testutil.Until(20*time.Second, func() bool { return backendOf() == "a" }); err != nil {
		return fmt.Errorf("envoy never served backend a: %w", err)
	}
	var apiLat, servedLat []time.Duration
	target := "a"
	for range flips {
		if target == "a" {
			target = "b"
		} else {
			target = "a"
		}
		start := time.Now()
		if _, err := c.SetTraffic(ctx, "svc", map[string]float64{target: 1}); err != nil {
			return err
		}
		apiLat = append(apiLat, time.Since(start))
		if err := testutil.Until(10*time.Second, func() bool { return backendOf() == target }); err != nil {
			return fmt.Errorf("envoy did not switch to %s: %w", target, err)
		}
		servedLat = append(servedLat, time.Since(start))
	}
	row("set-traffic API call (validate, checkpoint, publish), one node", apiLat)
	row("set-traffic API call -> Envoy serving the new split, one node", servedLat)
	return nil
}

func row(what string, lat []time.Duration) {
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("| %s | %d | %s | %s | %s |\n", what, len(lat), ms(q(0.5)), ms(q(0.99)), ms(lat[len(lat)-1]))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func replica(backend string) (string, func(), error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: &demoreplica.Replica{Backend: backend, Name: backend + "#0"}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), func() { _ = srv.Close() }, nil
}
