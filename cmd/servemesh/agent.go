package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/agent"
	"github.com/servemesh/servemesh/controlplane/store"
	"github.com/servemesh/servemesh/envoy"
)

func runAgent(ctx context.Context, log *slog.Logger, args []string, _ io.Writer) error {
	fs := newFlags("agent", "[flags]")
	var eo envoyOptions
	eo.register(fs)
	address := fs.String("address", "127.0.0.1", "the IP address this node's replicas listen on")
	cpus := fs.Float64("cpus", float64(runtime.NumCPU()), "CPUs this node offers to replicas")
	memory := fs.Int("memory-mb", memoryMB(), "MiB of memory this node offers to replicas")
	prefix := fs.String("consul-prefix", "servemesh", "Consul KV prefix of the controller's state; Consul is reached through CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN")
	drain := fs.Duration("drain-grace", 5*time.Second, "how long a draining replica serves in-flight requests before it is stopped (keep it equal to the controller's)")
	noEnvoy := fs.Bool("no-envoy", false, "do not run this node's Envoy")
	statusListen := fs.String("metrics-listen", "127.0.0.1:0", "address of the agent's /metrics, /v1/load (read by the controller) and /v1/envoy; port 0 picks one")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if eo.workDir == ".run/envoy" {
		eo.workDir = ".run/agent-" + eo.node.id
	}
	client, err := consulapi.NewClient(consulapi.DefaultConfig())
	if err != nil {
		return err
	}
	reg := newRegistry()
	admin := envoy.Admin{Address: eo.node.admin}
	if !*noEnvoy {
		agent.RegisterLoadMetrics(reg, admin, eo.node.id)
	}
	answer := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			v = map[string]string{"error": err.Error()}
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	statusAddr, stop, err := serveMetrics(ctx, log, *statusListen, reg, map[string]http.HandlerFunc{
		// The versions this node's Envoy holds (what it last ACKed), to
		// compare with the controller's /v1/xds/nodes.
		"GET /v1/envoy": func(w http.ResponseWriter, r *http.Request) {
			v, err := admin.Versions(r.Context())
			answer(w, v, err)
		},
		// The node's load, as its Envoy counts it; the controller reads it.
		"GET " + agent.LoadPath: func(w http.ResponseWriter, r *http.Request) {
			l, err := agent.ReadLoad(r.Context(), admin, eo.node.id)
			answer(w, l, err)
		},
	})
	if err != nil {
		return err
	}
	defer stop()
	a := agent.New(agent.Options{
		Node:   agent.Node{ID: eo.node.id, Address: *address, CPUs: *cpus, MemoryMB: *memory, StatusAddr: statusAddr},
		Consul: client, Store: store.NewConsul(client, *prefix), Logger: log.With("component", "agent"),
		WorkDir: eo.workDir + "/replicas", Registerer: reg, DrainGrace: *drain,
	})
	errs := make(chan error, 2)
	go func() { errs <- a.Run(ctx) }()
	if !*noEnvoy {
		sup, err := eo.prepare(ctx, log.With("component", "envoy"))
		if err != nil {
			return err
		}
		sup.OnStart = func(p *envoy.Process) {
			go func() {
				if err := p.WaitReady(ctx); err == nil {
					log.Info("envoy ready", "public", eo.node.public, "mesh", eo.node.mesh)
				}
			}()
		}
		go func() { errs <- sup.Run(ctx) }()
	}
	select {
	case <-ctx.Done():
	case err := <-errs:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return nil
}

// memoryMB reads the machine's memory from /proc/meminfo (1024 if unknown).
func memoryMB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 1024
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err == nil {
				return kb / 1024
			}
		}
	}
	return 1024
}
