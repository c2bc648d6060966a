package agent

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/wire"
)

// StatusHandler serves an agent's status listener: /metrics from reg, the
// node's load (wire.LoadPath, read by the controller) and the xDS versions
// its Envoy last accepted (wire.EnvoyVersionsPath), both read from the
// Envoy's admin API at admin, with what extra adds to the load, and, if
// logs is set, its replicas' and Envoy's logs (wire.LogsPath, LogsHandler).
// When Envoy cannot answer, the two JSON paths answer 503 with the reason.
func StatusHandler(reg prometheus.Gatherer, admin envoy.Admin, node string, extra LoadExtras, logs http.Handler) http.Handler {
	mux := http.NewServeMux()
	if logs != nil {
		mux.Handle("GET "+wire.LogsPath, logs)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET "+wire.EnvoyVersionsPath, func(w http.ResponseWriter, r *http.Request) {
		v, err := admin.Versions(r.Context())
		answer(w, v, err)
	})
	mux.HandleFunc("GET "+wire.LoadPath, func(w http.ResponseWriter, r *http.Request) {
		l, err := ReadLoad(r.Context(), admin, node)
		if extra.Held != nil {
			l.Held = extra.Held()
		}
		if extra.Replicas != nil {
			l.Configs, l.Draining = extra.Replicas.ConfigVersions(), extra.Replicas.DrainingInFlight()
		}
		if extra.Waiting != nil {
			l.Waiting = extra.Waiting()
		}
		if extra.Tracing != nil {
			l.Tracing = extra.Tracing()
		}
		if extra.GenAI != nil {
			l.GenAI = extra.GenAI()
		}
		if extra.Shadowed != nil {
			l.TokenQuotaShadowed = extra.Shadowed()
		}
		if extra.RateLimits != nil {
			if refused, loaded, err := extra.RateLimits(r.Context()); err != nil {
				l.RateLimitService, l.RateLimitsLoaded = err.Error(), map[string]string{}
			} else {
				l.GlobalRateLimited, l.RateLimitsLoaded = refused, loaded
			}
		}
		answer(w, l, err)
	})
	return mux
}

// LoadExtras are what a node's load report says besides Envoy's figures;
// nil funcs say nothing.
type LoadExtras struct {
	Held func() map[string]int // requests the activator holds, by backend
	// Replicas is what the agent keeps of its replicas: the user_config
	// version each runs and the requests in flight to each draining one.
	Replicas *ReplicaState
	Waiting  func() map[string]float64 // requests waiting for a replica, by backend (picker.Waiting)
	// RateLimits reads the node's rate limit service.
	RateLimits RateLimitReader
	// Tracing says why the agent's spans could not be sent to the mesh's
	// collector ("": they were; tracing.Tracer.Problem).
	Tracing func() string
	// GenAI are the GenAI histograms of the answers the node's Envoy read,
	// by backend (genai.Recorder.Loads).
	GenAI func() map[string]wire.GenAILoad
	// Shadowed are the requests token quotas in shadow mode would have
	// refused, by endpoint (genai.Recorder.Shadowed).
	Shadowed func() map[string]uint64
}

func answer(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		v = map[string]string{"error": "this node's envoy did not answer: " + err.Error()}
	}
	_ = json.NewEncoder(w).Encode(v)
}
