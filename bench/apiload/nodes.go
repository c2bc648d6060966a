package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// nodeMemory connects n distinct node ids once each (ask for clusters, get
// an answer, hang up) and reports the controller's memory before, right
// after, and once the gone nodes are bounded.
func (b *bench) nodeMemory(ctx context.Context, n int) error {
	if _, err := b.client.Apply(ctx, meshspec.SpecOf(endpoints(100, "n")), api.ApplyOptions{}); err != nil {
		return err
	}
	time.Sleep(time.Second)
	before, beforeHeap := testutil.RSSMiB(b.ctl.Pid()), b.heapMB(ctx)
	conn, err := grpc.NewClient(b.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	sem := make(chan struct{}, 2*runtime.NumCPU())
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := connectOnce(ctx, ads, fmt.Sprintf("bench-node-%d", i)); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	after, afterHeap := testutil.RSSMiB(b.ctl.Pid()), b.heapMB(ctx)
	time.Sleep(30 * time.Second) // Go returns freed memory to the OS over time
	later, laterHeap := testutil.RSSMiB(b.ctl.Pid()), b.heapMB(ctx)
	fmt.Printf("\n| controller memory | RSS | Go heap in use |\n|---|---:|---:|\n")
	fmt.Printf("| 100 endpoints, no node connected (baseline) | %.0f MiB | %.0f MiB |\n", before, beforeHeap)
	fmt.Printf("| 2 s after %d node ids each connected once (%d failed; connecting took %s) | %.0f MiB | %.0f MiB |\n", n, failed, took.Round(time.Millisecond), after, afterHeap)
	fmt.Printf("| 30 s later | %.0f MiB | %.0f MiB |\n", later, laterHeap)
	status, err := b.client.Status(ctx)
	if err == nil {
		fmt.Printf("| nodes it still keeps (at most 256 without a stream) | %d | |\n", len(status.Nodes))
	}
	return nil
}

// heapMB reads the controller's go_memstats_heap_inuse_bytes.
func (b *bench) heapMB(ctx context.Context) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.api+"/metrics", nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v / (1 << 20)
		}
	}
	return 0
}

// connectOnce opens an ADS stream as node id, asks for clusters, reads the
// answer and hangs up.
func connectOnce(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := wire.ProxyNode{ID: id, PublicAddress: "127.0.0.1", PublicPort: testutil.Port(testutil.MustFreeAddr("127.0.0.1")),
		MeshAddress: "127.0.0.1", MeshPort: 15001}.Metadata()
	if err != nil {
		return err
	}
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id, Metadata: md}, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}
