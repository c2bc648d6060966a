// Package main, the command gie-epp, is the Gateway API Inference
// Extension's reference endpoint picker run outside Kubernetes: the
// extension's lightweight EPP (pkg/lwepp/handlers, pinned in go.mod),
// unmodified, which is also the picker its conformance suite runs (it
// follows the test-epp-endpoint-selection header and reports the served
// endpoint in x-conformance-test-served-endpoint).
//
// Upstream's command (cmd/lwepp) cannot run here: it reads its endpoints
// from the Kubernetes API (an InferencePool and its pods, through
// controller-runtime), and with no API server it exits at start. Its
// ext_proc handlers read them through a two-method interface
// (handlers.Datastore); this command gives them a servemesh backend's
// passing replicas from Consul's catalog instead (each named by its
// node's address and its port, as servemesh names replicas to a picker),
// as llm-d runs its router outside Kubernetes with an endpoint-discovery
// plugin. Everything
// the protocol covers (the subset hint, the chosen endpoint in a header
// and in envoy.lb metadata, the served endpoint) is upstream's code.
//
//	gie-epp -listen 127.0.0.1:9002 -consul http://127.0.0.1:8500 -service <backend's Consul service> [-token-file F] [-tls-cert F -tls-key F]
//
// It serves the gRPC health services the protocol names (liveness,
// readiness, the ext_proc service) on the same address; readiness turns
// SERVING once the catalog has been read.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	consul "github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/lwepp/handlers"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9002", "the address the picker serves ext_proc and gRPC health on")
	consulAddr := flag.String("consul", "http://127.0.0.1:8500", "Consul's HTTP API")
	tokenFile := flag.String("token-file", "", "a file holding the Consul token to read the catalog with (service:read on -service)")
	service := flag.String("service", "", "the Consul service whose passing instances the picker chooses from (a servemesh backend's)")
	cert := flag.String("tls-cert", "", "serve TLS with this certificate (PEM), and -tls-key")
	key := flag.String("tls-key", "", "the certificate's private key (PEM)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *consulAddr, *tokenFile, *service, *cert, *key, log); err != nil {
		log.Error("gie-epp", "err", err)
		os.Exit(1)
	}
}

func run(listen, consulAddr, tokenFile, service, cert, key string, log *slog.Logger) error {
	if service == "" {
		return errors.New("-service: name the Consul service to pick from")
	}
	if (cert == "") != (key == "") {
		return errors.New("-tls-cert and -tls-key: give both or neither")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := consul.DefaultConfig()
	cfg.Address = consulAddr
	cfg.TokenFile = tokenFile
	client, err := consul.NewClient(cfg)
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	var opts []grpc.ServerOption
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return fmt.Errorf("-tls-cert, -tls-key: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})))
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	pool := &catalog{}
	srv := grpc.NewServer(opts...)
	extproc.RegisterExternalProcessorServer(srv, handlers.NewStreamingServer(pool))
	checks := health.NewServer()
	healthgrpc.RegisterHealthServer(srv, checks)
	checks.SetServingStatus("liveness", healthgrpc.HealthCheckResponse_SERVING)
	for _, name := range []string{"readiness", extproc.ExternalProcessor_ServiceDesc.ServiceName} {
		checks.SetServingStatus(name, healthgrpc.HealthCheckResponse_NOT_SERVING)
	}
	go pool.follow(ctx, client.Health(), service, log, func() {
		for _, name := range []string{"readiness", extproc.ExternalProcessor_ServiceDesc.ServiceName} {
			checks.SetServingStatus(name, healthgrpc.HealthCheckResponse_SERVING)
		}
	})
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Info("gie-epp serving", "listen", l.Addr().String(), "service", service, "tls", cert != "")
	return srv.Serve(l)
}

// catalog is the picker's datastore (handlers.Datastore): the service's
// passing instances, as Consul last listed them.
type catalog struct {
	mu        sync.RWMutex
	endpoints []*datastore.Endpoint
}

// PoolGet is the pool the endpoints belong to: the handlers ask for none
// of its fields.
func (c *catalog) PoolGet() (*datastore.EndpointPool, error) { return &datastore.EndpointPool{}, nil }

// PodList are the endpoints predicate keeps.
func (c *catalog) PodList(predicate func(*datastore.Endpoint) bool) []*datastore.Endpoint {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []*datastore.Endpoint
	for _, e := range c.endpoints {
		if predicate(e) {
			out = append(out, e)
		}
	}
	return out
}

// inboundMeta is the Consul service meta key where a servemesh agent
// registers the node's inbound listener (IP:port) beside a replica (the
// servemesh module's wire.MetaReplicaInbound).
const inboundMeta = "servemesh_inbound"

// endpointHost is the address a replica is named by: its node's, where the
// node's inbound listener reaches it (mTLS), for replicas listen on their
// node's loopback; else the address it registered with. A replica is then
// its node's address and its own port, and one node's replicas are the
// ranks of one address.
func endpointHost(e *consul.ServiceEntry) string {
	if inbound := e.Service.Meta[inboundMeta]; inbound != "" {
		if host, _, err := net.SplitHostPort(inbound); err == nil {
			return host
		}
	}
	if e.Service.Address != "" {
		return e.Service.Address
	}
	return e.Node.Address
}

// follow keeps the endpoints those of service's instances passing their
// checks (a blocking query, retried a second after a failure), calling
// synced after the first read.
func (c *catalog) follow(ctx context.Context, h *consul.Health, service string, log *slog.Logger, synced func()) {
	var index uint64
	first := true
	for ctx.Err() == nil {
		entries, meta, err := h.Service(service, "", true, (&consul.QueryOptions{WaitIndex: index, WaitTime: 30 * time.Second}).WithContext(ctx))
		if err != nil {
			log.Warn("reading the catalog", "service", service, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		index = meta.LastIndex
		var eps []*datastore.Endpoint
		for _, e := range entries {
			addr := endpointHost(e)
			name := strings.ReplaceAll(e.Service.ID, "/", "-")
			eps = append(eps, &datastore.Endpoint{NamespacedName: types.NamespacedName{Name: name}, PodName: name, Address: addr, Port: strconv.Itoa(e.Service.Port)})
		}
		c.mu.Lock()
		c.endpoints = eps
		c.mu.Unlock()
		if first {
			first = false
			synced()
		}
	}
}
