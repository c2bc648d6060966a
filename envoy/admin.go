package envoy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Admin talks to one Envoy's admin API, on its Unix socket.
type Admin struct {
	// Socket is the path of the admin API's Unix socket, as in the
	// bootstrap (bootstrap.Options.AdminSocket).
	Socket string
}

func (a Admin) client() *http.Client {
	var d net.Dialer
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", a.Socket)
		},
		DisableKeepAlives: true,
	}}
}

// Get answers GET path (with its query) from the admin API: the body, or
// an error when Envoy does not answer 200.
func (a Admin) Get(ctx context.Context, path string) ([]byte, error) {
	body, code, err := a.do(ctx, http.MethodGet, path)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("envoy admin %s: status %d: %s", path, code, body)
	}
	return body, nil
}

func (a Admin) do(ctx context.Context, method, path string) ([]byte, int, error) {
	// The host names nothing: every request goes to the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://envoy-admin"+path, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("envoy admin %s %s: %w", method, path, err)
	}
	resp, err := a.client().Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("envoy admin %s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("envoy admin %s %s: read body: %w", method, path, err)
	}
	return body, resp.StatusCode, nil
}

// Ready reports whether Envoy says it is LIVE (initialised, serving).
func (a Admin) Ready(ctx context.Context) (bool, error) {
	body, code, err := a.do(ctx, http.MethodGet, "/ready")
	if err != nil {
		return false, err
	}
	return code == http.StatusOK && strings.TrimSpace(string(body)) == "LIVE", nil
}

// ConfigDump returns /config_dump, optionally limited to a resource kind such
// as "dynamic_active_clusters".
func (a Admin) ConfigDump(ctx context.Context, resource string) ([]byte, error) {
	path := "/config_dump"
	if resource != "" {
		path += "?resource=" + url.QueryEscape(resource)
	}
	return a.Get(ctx, path)
}

// Stats returns counters and gauges whose names match the regular expression
// filter (all when empty).
func (a Admin) Stats(ctx context.Context, filter string) (map[string]uint64, error) {
	stats, _, err := a.StatsAndHistograms(ctx, filter, nil)
	return stats, err
}

// StatsAndHistograms returns, besides the counters and gauges Stats does,
// the histograms whose names match filter, as cumulative counts at bounds
// (each histogram must have a bucket at every bound, else it is left
// out). Envoy merges histograms at each stats flush (the bootstrap's
// stats_flush_interval), so they may lag the counters by that much.
func (a Admin) StatsAndHistograms(ctx context.Context, filter string, bounds []float64) (map[string]uint64, map[string][]uint64, error) {
	path := "/stats?format=json"
	if filter != "" {
		path += "&filter=" + url.QueryEscape(filter)
	}
	if bounds != nil {
		path += "&histogram_buckets=cumulative"
	}
	body, code, err := a.do(ctx, http.MethodGet, path)
	if err != nil {
		return nil, nil, err
	}
	if code != http.StatusOK {
		return nil, nil, fmt.Errorf("envoy admin /stats: status %d: %s", code, body)
	}
	var parsed struct {
		Stats []struct {
			Name       string          `json:"name"`
			Value      json.RawMessage `json:"value"`
			Histograms json.RawMessage `json:"histograms"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(body, &parsed); err != nil {
		return nil, nil, fmt.Errorf("envoy admin /stats: %w", err)
	}
	out, hists := map[string]uint64{}, map[string][]uint64{}
	for _, s := range parsed.Stats {
		var v uint64
		switch {
		case s.Name != "" && json.Unmarshal(s.Value, &v) == nil:
			out[s.Name] = v
		case len(s.Histograms) > 0 && bounds != nil:
			readHistograms(s.Histograms, bounds, hists)
		}
	}
	return out, hists, nil
}

// readHistograms adds the cumulative histograms of one /stats answer
// (histogram_buckets=cumulative) that have a bucket at every bound.
func readHistograms(raw json.RawMessage, bounds []float64, into map[string][]uint64) {
	var hs []struct {
		Name    string `json:"name"`
		Buckets []struct {
			UpperBound float64 `json:"upper_bound"`
			Cumulative uint64  `json:"cumulative"`
		} `json:"buckets"`
	}
	if json.Unmarshal(raw, &hs) != nil {
		return
	}
	for _, h := range hs {
		at := make(map[float64]uint64, len(h.Buckets))
		for _, b := range h.Buckets {
			at[b.UpperBound] = b.Cumulative
		}
		counts := make([]uint64, 0, len(bounds))
		for _, bound := range bounds {
			c, ok := at[bound]
			if !ok {
				break
			}
			counts = append(counts, c)
		}
		if len(counts) == len(bounds) {
			into[h.Name] = counts
		}
	}
}

// DrainListeners asks Envoy to drain every listener gracefully: it stops
// accepting new connections and asks clients to close existing ones over the
// drain period.
func (a Admin) DrainListeners(ctx context.Context) error {
	return a.post(ctx, "/drain_listeners?graceful")
}

// ReopenLogs makes Envoy reopen its access logs, after they were moved.
func (a Admin) ReopenLogs(ctx context.Context) error {
	return a.post(ctx, "/reopen_logs")
}

// post makes an admin request that changes something and answers 200.
func (a Admin) post(ctx context.Context, path string) error {
	body, code, err := a.do(ctx, http.MethodPost, path)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		name, _, _ := strings.Cut(path, "?")
		return fmt.Errorf("envoy admin %s: status %d: %s", name, code, body)
	}
	return nil
}

// ConfigVersions are the xDS versions an Envoy holds: what it last ACKed.
type ConfigVersions struct {
	Clusters  string            `json:"clusters"`
	Listeners string            `json:"listeners"`
	Routes    map[string]string `json:"routes"`
	// Connected reports whether Envoy's xDS stream is up.
	Connected bool `json:"connected"`
}

// Versions reads the versions of the dynamic config Envoy holds.
func (a Admin) Versions(ctx context.Context) (ConfigVersions, error) {
	out := ConfigVersions{Routes: map[string]string{}}
	dump, err := a.ConfigDump(ctx, "")
	if err != nil {
		return out, err
	}
	var parsed struct {
		Configs []struct {
			Type                string `json:"@type"`
			VersionInfo         string `json:"version_info"`
			DynamicRouteConfigs []struct {
				VersionInfo string `json:"version_info"`
				RouteConfig struct {
					Name string `json:"name"`
				} `json:"route_config"`
			} `json:"dynamic_route_configs"`
		} `json:"configs"`
	}
	if err := json.Unmarshal(dump, &parsed); err != nil {
		return out, fmt.Errorf("envoy admin /config_dump: %w", err)
	}
	for _, c := range parsed.Configs {
		switch {
		case strings.HasSuffix(c.Type, ".ClustersConfigDump"):
			out.Clusters = c.VersionInfo
		case strings.HasSuffix(c.Type, ".ListenersConfigDump"):
			out.Listeners = c.VersionInfo
		case strings.HasSuffix(c.Type, ".RoutesConfigDump"):
			for _, r := range c.DynamicRouteConfigs {
				out.Routes[r.RouteConfig.Name] = r.VersionInfo
			}
		}
	}
	stats, err := a.Stats(ctx, `^control_plane\.connected_state$`)
	if err != nil {
		return out, err
	}
	out.Connected = stats["control_plane.connected_state"] == 1
	return out, nil
}

// ParentConnections is the connections the Envoy this one replaced by a
// hot restart still serves (server.parent_connections, which Envoy merges
// from its parent at each stats flush). It fails if Envoy reports none.
func (a Admin) ParentConnections(ctx context.Context) (uint64, error) {
	stats, err := a.Stats(ctx, `^server\.parent_connections$`)
	if err != nil {
		return 0, err
	}
	n, ok := stats["server.parent_connections"]
	if !ok {
		return 0, errors.New("envoy admin /stats: no server.parent_connections")
	}
	return n, nil
}
