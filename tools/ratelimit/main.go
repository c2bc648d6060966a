// Package main, the command ratelimit, is servemesh's build of Envoy's
// rate limit service, the backend of global rate limits: envoyproxy/ratelimit (Apache-2.0,
// with Redis as its store), pinned in go.mod. Its main branch is the
// release line (it publishes no tags), so the pin is a commit's
// pseudo-version.
//
// It is upstream's runner (service_cmd/runner) with one difference: it
// serves the gRPC API Envoy calls on the unix socket GRPC_UDS alone, a
// file only its own user can connect to. Upstream's runner always opens
// an HTTP listener (HOST:PORT), whose /json answers ShouldRateLimit to
// anyone who connects, and a debug listener; on a node, any local user (a
// replica's too) could spend an endpoint's mesh-wide limit through them
// and make it refuse everyone (issue 58, M6). Its Prometheus metrics stay
// on PROMETHEUS_ADDR (read-only). The settings are upstream's
// environment variables; Redis is the only backend.
package main

import (
	"context"
	"math/rand"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/coocood/freecache"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	gostats "github.com/lyft/gostats"
	logger "github.com/sirupsen/logrus"

	"github.com/envoyproxy/ratelimit/src/metrics"
	"github.com/envoyproxy/ratelimit/src/redis"
	"github.com/envoyproxy/ratelimit/src/server"
	ratelimit "github.com/envoyproxy/ratelimit/src/service"
	"github.com/envoyproxy/ratelimit/src/settings"
	"github.com/envoyproxy/ratelimit/src/stats"
	"github.com/envoyproxy/ratelimit/src/stats/prom"
	"github.com/envoyproxy/ratelimit/src/utils"
)

func main() {
	// Files it creates, the socket first, are its user's alone.
	syscall.Umask(0o077)
	s := settings.NewSettings()
	configureLogging(s)
	if s.GrpcUds == "" || (s.BackendType != "" && s.BackendType != "redis") {
		logger.Fatal("this build serves its gRPC API on a unix socket alone, with Redis: set GRPC_UDS, and BACKEND_TYPE=redis or none")
	}
	store := gostats.NewStore(gostats.NewNullSink(), false)
	if s.UsePrometheus {
		store = gostats.NewStore(prom.NewPrometheusSink(prom.WithAddr(s.PrometheusAddr), prom.WithPath(s.PrometheusPath),
			prom.WithMapperYamlPath(s.PrometheusMapperYaml)), false)
	}
	go store.Start(time.NewTicker(s.StatsFlushInterval))
	statsManager := stats.NewStatManager(store, s)

	var localCache *freecache.Cache
	if s.LocalCacheSizeInBytes != 0 {
		localCache = freecache.NewCache(s.LocalCacheSizeInBytes)
	}
	reporter := metrics.NewServerReporter(store.ScopeWithTags("ratelimit_server", s.ExtraTags))
	srv := server.NewServer(s, "ratelimit", statsManager, localCache, settings.GrpcUnaryInterceptor(reporter.UnaryServerInterceptor()))
	limiter, closer := redis.NewRateLimiterCacheImplFromSettings(s, localCache, srv, utils.NewTimeSourceImpl(),
		rand.New(utils.NewLockedSource(time.Now().Unix())), s.ExpirationJitterMaxSeconds, statsManager)
	service := ratelimit.NewService(limiter, srv.Provider(), statsManager, srv.HealthChecker(), utils.NewTimeSourceImpl(),
		s.GlobalShadowMode, s.ForceStartWithoutInitialConfig, s.HealthyWithAtLeastOneConfigLoaded)
	pb.RegisterRateLimitServiceServer(srv.GrpcServer(), service)

	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "unix", s.GrpcUds)
	if err != nil {
		logger.Fatalf("listen on %s: %v", s.GrpcUds, err)
	}
	go func() {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		sig := <-sigs
		logger.Infof("received %v, shutting down gracefully", sig)
		srv.Stop() // stops the gRPC server gracefully: Serve returns
	}()
	logger.Warnf("Listening for gRPC on '%s' (alone)", s.GrpcUds)
	if err := srv.GrpcServer().Serve(lis); err != nil {
		logger.Errorf("gRPC server: %v", err)
	}
	_ = closer.Close()
}

// configureLogging sets the log level and format as upstream's runner does.
func configureLogging(s settings.Settings) {
	level, err := logger.ParseLevel(s.LogLevel)
	if err != nil {
		logger.Fatalf("Could not parse log level. %v", err)
	}
	logger.SetLevel(level)
	if strings.ToLower(s.LogFormat) == "json" {
		logger.SetFormatter(&logger.JSONFormatter{
			TimestampFormat: time.RFC3339Nano,
			FieldMap:        logger.FieldMap{logger.FieldKeyTime: "@timestamp", logger.FieldKeyMsg: "@message"},
		})
	}
}
