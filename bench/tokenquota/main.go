// Package main measures how far a token quota's answers overshoot
// it under concurrent load: on the default mesh (mTLS, two nodes, each
// node's rate limit service over one real Redis), an endpoint of stand-in
// model servers with a quota of -quota tokens an hour is sent chat
// requests by -concurrency clients at once, through both nodes, until
// every client has been refused (429); the tokens answered beyond the
// quota are its overshoot. A request is checked before it is sent and its
// answer charged as it ends, so the requests checked before the quota's
// last answers were charged pass: the bound is about the concurrency
// times an answer's tokens. Each concurrency runs -runs times against a
// fresh quota (an endpoint of its own); the figures are medians.
//
//	go run ./bench/tokenquota -runs 3 -concurrency 1,4,16
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/agent/ratelimit"
	"github.com/servemesh/servemesh/bench/benchenv"
	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/dev/devredis"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

func main() {
	runs := flag.Int("runs", 3, "runs of each concurrency, each against a fresh quota; the figures are their medians")
	concurrency := flag.String("concurrency", "1,4,16", "clients sending at once, comma-separated")
	quota := flag.Int("quota", 2000, "the quota's tokens (an hour: it does not refill during a run)")
	completion := flag.Int("max-tokens", 50, "each answer's completion tokens (max_tokens)")
	service := flag.Duration("service", 20*time.Millisecond, "the stand-in model server's time for each answer")
	flag.Parse()
	if err := run(*runs, *concurrency, *quota, *completion, *service); err != nil {
		fmt.Fprintln(os.Stderr, "tokenquota:", err)
		os.Exit(1)
	}
}

func run(runs int, concurrency string, quota, completion int, service time.Duration) error {
	levels, err := benchenv.Counts("concurrency", concurrency, 256)
	if err != nil {
		return err
	}
	ctx := context.Background()
	be, err := benchenv.Start(ctx, "tokenquota")
	if err != nil {
		return err
	}
	defer be.Close()
	redis, err := devredis.Start(be.Dir, 0, "bench-redis")
	if err != nil {
		return err
	}
	defer redis.Stop()
	mesh, err := startMesh(be, redis)
	if err != nil {
		return err
	}
	defer mesh.Stop()
	if err := createBackend(ctx, be, mesh.Client, service); err != nil {
		return err
	}
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"how far over?"}],"max_tokens":%d}`, completion)
	perAnswer := demoreplica.PromptTokens([]byte(body)) + completion
	fmt.Printf("quota %d tokens; each answer %d tokens (%d prompt, %d completion), the stand-in %s an answer; medians of %d runs\n\n",
		quota, perAnswer, perAnswer-completion, completion, service, runs)
	fmt.Println("| clients at once | tokens answered | overshoot (tokens) | overshoot (answers) | bound: clients × an answer | requests refused (429) |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|")
	for _, c := range levels {
		var answered, refused []int
		for r := range runs {
			name := fmt.Sprintf("q%d-%d", c, r)
			a, n, err := measure(ctx, mesh, name, quota, c, body)
			if err != nil {
				return fmt.Errorf("%d clients, run %d: %w", c, r+1, err)
			}
			answered, refused = append(answered, a), append(refused, n)
		}
		a := median(answered)
		fmt.Printf("| %d | %d | %d | %.1f | %d | %d |\n", c, a, a-quota, float64(a-quota)/float64(perAnswer), c*perAnswer, median(refused))
	}
	return nil
}

// startMesh runs a controller and two nodes, each with its rate limit
// service over redis.
func startMesh(be *benchenv.Env, redis *devredis.Server) (*benchenv.Mesh, error) {
	passwordFile := filepath.Join(be.Dir, "redis-password")
	if err := os.WriteFile(passwordFile, []byte(redis.Password), 0o600); err != nil {
		return nil, err
	}
	bin, err := ratelimit.Find("")
	if err != nil {
		return nil, err
	}
	return be.StartMesh(benchenv.MeshOptions{Work: filepath.Join(be.Dir, "quota"), NodeCPUs: []string{"4", "4"},
		AgentArgs: []string{"--rate-limit-redis", redis.Addr, "--rate-limit-redis-password-file", passwordFile, "--rate-limit-service", bin}})
}

// createBackend places two stand-in model servers, one on each node.
func createBackend(ctx context.Context, be *benchenv.Env, c *api.Client, service time.Duration) error {
	spec := &meshspec.ProcessSpec{Command: be.Bin, HealthPath: "/health",
		Args: []string{"demo-model-server", "--backend", "llm", "--listen", "${HOST}:${PORT}", "--slots", "64", "--service", service.String()}}
	return testutil.Until(60*time.Second, func() bool {
		_, err := c.CreateBackend(ctx, meshspec.BackendSpec{Name: "llm", Process: spec, Config: meshspec.BackendConfig{NumReplicas: 2, CPUs: 1}})
		return err == nil
	})
}

// measure creates endpoint name with a fresh quota, waits until every
// node serves it, and has clients send body until each is refused; it
// returns the tokens answered and the requests refused.
func measure(ctx context.Context, mesh *benchenv.Mesh, name string, quota, clients int, body string) (answered, refused int, err error) {
	e := meshspec.Endpoint{Name: name, Route: "/" + name, Methods: []string{"POST"}, Traffic: map[string]float64{"llm": 1},
		RateLimit: &meshspec.RateLimit{Tokens: &meshspec.TokenQuota{Tokens: quota, Unit: "hour"}}}
	if _, err := mesh.Client.CreateEndpoint(ctx, e); err != nil {
		return 0, 0, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := mesh.Client.WaitServed(waitCtx, api.ServedQuery{Endpoints: []string{name}}, nil); err != nil {
		return 0, 0, fmt.Errorf("endpoint %s served: %w", name, err)
	}
	var tokens, refusals atomic.Int64
	var failure atomic.Value
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	deadline := time.Now().Add(2 * time.Minute)
	for i := range clients {
		url := "http://" + mesh.Public[i%len(mesh.Public)] + "/" + name
		wg.Go(func() {
			for time.Now().Before(deadline) {
				status, used, err := chat(ctx, client, url, body)
				switch {
				case err != nil:
					failure.CompareAndSwap(nil, err)
					return
				case status == http.StatusTooManyRequests:
					refusals.Add(1)
					return // refused: the quota is spent, as this client sees it
				case status != http.StatusOK:
					failure.CompareAndSwap(nil, fmt.Errorf("status %d", status))
					return
				}
				tokens.Add(int64(used))
			}
			failure.CompareAndSwap(nil, fmt.Errorf("never refused within 2 minutes"))
		})
	}
	wg.Wait()
	if f := failure.Load(); f != nil {
		return 0, 0, f.(error)
	}
	return int(tokens.Load()), int(refusals.Load()), nil
}

// chat sends one chat request and reads the tokens its answer states.
func chat(ctx context.Context, client *http.Client, url, body string) (status, tokens int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp.StatusCode, 0, err
	}
	var answer struct {
		Usage demoreplica.Usage `json:"usage"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return 0, 0, fmt.Errorf("the answer: %w", err)
	}
	return resp.StatusCode, answer.Usage.TotalTokens, nil
}

func median(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
