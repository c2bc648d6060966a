// Package main measures what a node whose clusters come on demand
// (--clusters on-demand) pays on the first request to each endpoint,
// beside a node that holds every cluster, in one run: the real controller
// and Consul, the default mode (mTLS), two nodes (n1, the caller, runs no
// replica; n2 the replicas' node), -endpoints endpoints of a backend each
// (their replicas one demo replica the bench runs, listed statically), and
// for each endpoint in turn its first request through n1's public
// listener, timed, then -after more. It reports, per mode and as medians
// of -runs runs, the first requests' p50 and p99 and the later requests'
// p50.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	var o options
	flag.IntVar(&o.endpoints, "endpoints", 20, "endpoints, each of a backend of its own, each first called once")
	flag.IntVar(&o.after, "after", 20, "requests to each endpoint after its first")
	flag.IntVar(&o.runs, "runs", 3, "runs of each mode; the figures are their medians")
	flag.Parse()
	if err := o.table(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "ondemand:", err)
		os.Exit(1)
	}
}

// table measures both modes, -runs times each, and prints their medians.
func (o options) table(ctx context.Context) error {
	be, err := benchenv.Start(ctx, "ondemand")
	if err != nil {
		return err
	}
	defer be.Close()
	fmt.Printf("%d endpoints through n1 (mTLS, the replica on another address), %d requests after each first; medians of %d runs\n\n", o.endpoints, o.after, o.runs)
	fmt.Println("| n1's clusters | first request p50 | first request p99 | later requests p50 |")
	fmt.Println("|---|---:|---:|---:|")
	for _, mode := range []string{"all", "on-demand"} {
		var firsts50, firsts99, laters []time.Duration
		for run := range o.runs {
			f, l, err := o.run(ctx, be, mode, run)
			if err != nil {
				return err
			}
			firsts50, firsts99 = append(firsts50, benchenv.Percentile(f, 50)), append(firsts99, benchenv.Percentile(f, 99))
			laters = append(laters, benchenv.Percentile(l, 50))
		}
		fmt.Printf("| %s | %s | %s | %s |\n", mode, millis(benchenv.Percentile(firsts50, 50)), millis(benchenv.Percentile(firsts99, 50)), millis(benchenv.Percentile(laters, 50)))
	}
	return nil
}

type options struct{ endpoints, after, runs int }

// run starts a mesh whose caller node's clusters are mode's, makes the
// endpoints, and times each one's first request and the ones after.
func (o options) run(ctx context.Context, be *benchenv.Env, mode string, run int) (firsts, laters []time.Duration, err error) {
	replica := testutil.MustFreeAddr("127.0.0.1")
	r, err := proc.Start(proc.Spec{Path: be.Bin, Args: []string{"demo-replica", "--backend", "bench", "--listen", replica}})
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = r.Stop(5 * time.Second) }()
	mesh, err := be.StartMesh(benchenv.MeshOptions{Work: filepath.Join(be.Dir, fmt.Sprintf("%s-%d", mode, run)), NodeCPUs: []string{"0.5", "4"},
		AgentArgs: []string{"--clusters", mode}, ControllerArgs: []string{"--allow-replica-cidr", "127.0.0.0/8"}})
	if err != nil {
		return nil, nil, err
	}
	defer mesh.Stop()
	spec := meshspec.Spec{}
	for i := range o.endpoints {
		name := fmt.Sprintf("e%d", i)
		spec.Backends = append(spec.Backends, meshspec.BackendSpec{Name: name, Replicas: []meshspec.ReplicaSpec{{Address: replica}}})
		spec.Endpoints = append(spec.Endpoints, meshspec.Endpoint{Name: name, Route: "/" + name, Traffic: map[string]float64{name: 1}})
	}
	if err := testutil.Until(60*time.Second, func() bool { _, err := mesh.Client.Apply(ctx, &spec, api.ApplyOptions{}); return err == nil }); err != nil {
		return nil, nil, fmt.Errorf("apply: %w", err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(url string) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %d", url, resp.StatusCode)
		}
		return time.Since(start), nil
	}
	// The mesh is served once the last endpoint's route answers through
	// n2, whose clusters are all there in either mode (it runs no
	// on-demand fetch for n1).
	last := fmt.Sprintf("http://%s/e%d", mesh.Public[1], o.endpoints-1)
	if err := testutil.Until(60*time.Second, func() bool { _, err := get(last); return err == nil }); err != nil {
		return nil, nil, fmt.Errorf("the mesh is not served: %w", err)
	}
	if err := testutil.Until(60*time.Second, func() bool { return inSync(ctx, mesh) }); err != nil {
		return nil, nil, fmt.Errorf("the nodes are not in sync: %w", err)
	}
	for i := range o.endpoints {
		url := fmt.Sprintf("http://%s/e%d", mesh.Public[0], i)
		d, err := get(url)
		if err != nil {
			return nil, nil, fmt.Errorf("first request: %w", err)
		}
		firsts = append(firsts, d)
		for range o.after {
			d, err := get(url)
			if err != nil {
				return nil, nil, err
			}
			laters = append(laters, d)
		}
	}
	slices.Sort(firsts)
	return firsts, laters, nil
}

// inSync reports whether both nodes hold the latest config.
func inSync(ctx context.Context, mesh *benchenv.Mesh) bool {
	s, err := mesh.Client.Status(ctx)
	if err != nil || len(s.Nodes) != 2 {
		return false
	}
	for _, n := range s.Nodes {
		if !n.InSync {
			return false
		}
	}
	return true
}

func millis(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
