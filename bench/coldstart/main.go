// Package main measures the replica lifecycle's cold path and the bound on
// held requests, in the default mode (mTLS, two nodes, each with its Envoy):
//
//   - cold path: an autoscaled backend at zero replicas gets one request
//     through n1; the node's activator holds it, the autoscaler wakes the
//     backend, the replica starts (the demo replica, told to take
//     -start-delay to listen, as a model server loading its weights), and
//     the request is answered. Reported: the time to that answer, the
//     replica's own start (from its log: started to listening) and their
//     difference, what servemesh adds; medians of -runs, each from zero.
//   - held-request bound: a backend whose replica never gets ready, with
//     hold_timeout_s and max_held set, gets more requests at once than it
//     may hold: those beyond max_held are answered 503 at once, the others
//     503 when the hold times out.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	runs := flag.Int("runs", 5, "cold starts measured; the figures are their medians")
	startDelay := flag.Duration("start-delay", time.Second, "how long the replica takes to listen")
	held := flag.Int("held", 80, "requests sent at once to the backend that never gets ready")
	maxHeld := flag.Int("max-held", 50, "its max_held")
	holdTimeout := flag.Duration("hold-timeout", 2*time.Second, "its hold_timeout_s")
	flag.Parse()
	if err := run(*runs, *startDelay, *held, *maxHeld, *holdTimeout); err != nil {
		fmt.Fprintln(os.Stderr, "coldstart:", err)
		os.Exit(1)
	}
}

func run(runs int, startDelay time.Duration, held, maxHeld int, holdTimeout time.Duration) error {
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "coldstart")
	if err != nil {
		return err
	}
	defer be.Close()
	work := filepath.Join(be.Dir, "mesh")
	mesh, err := be.StartMesh(benchenv.MeshOptions{Work: work, NodeCPUs: []string{"4", "4"}})
	if err != nil {
		return err
	}
	defer mesh.Stop()
	replica := func(name string, delay time.Duration) *meshspec.ProcessSpec {
		return &meshspec.ProcessSpec{Command: be.Bin, HealthPath: "/",
			Args: []string{"demo-replica", "--backend", name, "--listen", "${HOST}:${PORT}", "--start-delay", delay.String()}}
	}
	as := &meshspec.AutoscalingConfig{MinReplicas: 0, MaxReplicas: 1, TargetInFlight: 1, MetricsIntervalS: 0.2, LookBackPeriodS: 0.5,
		UpscaleDelayS: 0.5, DownscaleDelayS: 1}
	backends := []meshspec.BackendSpec{
		{Name: "cold", Process: replica("cold", startDelay), Config: meshspec.BackendConfig{CPUs: 1, Autoscaling: as}},
		{Name: "never", Process: replica("never", time.Hour),
			Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1, HoldTimeoutS: holdTimeout.Seconds(), MaxHeld: maxHeld}},
	}
	for _, b := range backends {
		if err := testutil.Until(30*time.Second, func() bool { _, err := mesh.Client.CreateBackend(ctx, b); return err == nil }); err != nil {
			return fmt.Errorf("create backend %s (are the agents up?): %w", b.Name, err)
		}
		if _, err := mesh.Client.CreateEndpoint(ctx, meshspec.Endpoint{Name: b.Name, Route: "/" + b.Name, Traffic: map[string]float64{b.Name: 1}}); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second) // the nodes have the routes
	var answer, own []time.Duration
	for i := range runs {
		a, o, err := coldStart(ctx, mesh, work, "http://"+mesh.Public[0]+"/cold")
		if err != nil {
			return fmt.Errorf("cold start %d: %w", i, err)
		}
		answer, own = append(answer, a), append(own, o)
	}
	added := make([]time.Duration, len(answer))
	for i := range answer {
		added[i] = answer[i] - own[i]
	}
	fmt.Printf("cold path, medians of %d starts from zero replicas (the replica listens %s after it starts):\n\n", runs, startDelay)
	fmt.Println("| first answer | the replica's own start | added by servemesh | added, each run |")
	fmt.Println("|---:|---:|---:|---|")
	fmt.Printf("| %s | %s | %s | %s |\n\n", ms(median(answer)), ms(median(own)), ms(median(added)), list(added))
	return bound(mesh.Public[0], held, maxHeld, holdTimeout)
}

// coldStart waits for cold to be at zero replicas, then sends one request
// and returns how long its answer took and how long the replica that
// answered took to start (from its log).
func coldStart(ctx context.Context, mesh *benchenv.Mesh, work, url string) (answer, own time.Duration, err error) {
	if err := testutil.Until(60*time.Second, func() bool { return running(ctx, mesh.Client, "cold") == 0 }); err != nil {
		return 0, 0, errors.New("cold never went back to zero replicas")
	}
	time.Sleep(500 * time.Millisecond) // the drained replica is gone from every node
	client := &http.Client{Timeout: 60 * time.Second}
	start := time.Now()
	resp, err := client.Get(url) //nolint:noctx // one bounded request
	if err != nil {
		return 0, 0, err
	}
	_ = resp.Body.Close()
	answer = time.Since(start)
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	own, err = newestStart(work, "cold")
	return answer, own, err
}

// running counts backend's running placements.
func running(ctx context.Context, c *api.Client, backend string) int {
	b, err := c.GetBackend(ctx, backend)
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range b.Placements {
		if p.State == meshspec.Running {
			n++
		}
	}
	return n
}

var logTime = regexp.MustCompile(`^time=(\S+) `)

// newestStart reads, from the newest replica log of backend under work, how
// long the replica took from starting to listening.
func newestStart(work, backend string) (time.Duration, error) {
	logs, _ := filepath.Glob(filepath.Join(work, "*", "replicas", "*"+backend+"*.log"))
	sort.Slice(logs, func(i, j int) bool { return modTime(logs[i]).After(modTime(logs[j])) })
	if len(logs) == 0 {
		return 0, fmt.Errorf("no replica log of %s under %s", backend, work)
	}
	f, err := os.Open(logs[0])
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	var started, serving time.Time
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		m := logTime.FindStringSubmatch(lines.Text())
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(lines.Text(), `msg="demo replica starting"`):
			started = at
		case strings.Contains(lines.Text(), `msg="demo replica serving"`):
			serving = at
		}
	}
	if started.IsZero() || serving.IsZero() {
		return 0, fmt.Errorf("%s: no start and serving lines", logs[0])
	}
	return serving.Sub(started), nil
}

func modTime(path string) time.Time {
	info, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return info.ModTime()
}

// bound sends n requests at once to the backend that never gets ready and
// reports how they were answered.
func bound(public string, n, maxHeld int, holdTimeout time.Duration) error {
	type answer struct {
		took   time.Duration
		status int
		body   string
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: time.Minute}
			resp, err := client.Get("http://" + public + "/never") //nolint:noctx // bounded by the client's timeout
			if err != nil {
				answers[i] = answer{took: time.Since(start), body: err.Error()}
				return
			}
			defer func() { _ = resp.Body.Close() }()
			body := make([]byte, 512)
			k, _ := resp.Body.Read(body)
			answers[i] = answer{took: time.Since(start), status: resp.StatusCode, body: string(body[:k])}
		}()
	}
	wg.Wait()
	var full, timedOut, other []time.Duration
	for _, a := range answers {
		switch {
		case a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "max_held"):
			full = append(full, a.took)
		case a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "hold_timeout_s"):
			timedOut = append(timedOut, a.took)
		default:
			other = append(other, a.took)
			fmt.Printf("unexpected answer: %d %q\n", a.status, a.body)
		}
	}
	fmt.Printf("held-request bound: %d requests at once to a backend whose replica never gets ready (max_held %d, hold_timeout_s %g):\n\n",
		n, maxHeld, holdTimeout.Seconds())
	fmt.Println("| answer | requests | time to answer, p50 / max |")
	fmt.Println("|---|---:|---:|")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"503 at once: max_held reached", full}, {"503 when the hold timed out", timedOut}, {"anything else", other}} {
		if len(row.ds) == 0 {
			fmt.Printf("| %s | 0 | - |\n", row.name)
			continue
		}
		fmt.Printf("| %s | %d | %s / %s |\n", row.name, len(row.ds), ms(median(row.ds)), ms(slices.Max(row.ds)))
	}
	return nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }

func list(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%.0f", float64(d.Microseconds())/1000)
	}
	return strings.Join(out, ", ") + " ms"
}
