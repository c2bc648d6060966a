package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Live config (Ray Serve's reconfigure). A backend's user_config reaches
// each of its replicas by an HTTP POST of the JSON to the process's
// reconfigure_path, made by the replica's probe: before the replica is
// first reported ready (so it is never routed to without it), and at the
// next probe after the config changes, while it serves on. A replica that
// does not answer 2xx is reported critical, so Envoy stops sending it
// requests, and is sent the config again at each probe until it takes it.
// A replica whose process restarts is sent it again. Each replica's
// applied version (meshspec.UserConfig.Version) is in its node's load
// report, for status. The POST carries the replica's own secret
// (wire.ReconfigureTokenHeader), which the replica checks: nobody else who
// reaches it can change its config, so the version in the report is the
// one it runs.

// reconfigureTimeout bounds one POST of the config (a replica may load
// something to take it: longer than a probe's second).
const reconfigureTimeout = 10 * time.Second

// reconfigureClient posts configs; each POST's context bounds it.
var reconfigureClient = &http.Client{CheckRedirect: httpserver.NoRedirects}

// setConfig makes u the config the replica should run.
func (r *replica) setConfig(u meshspec.UserConfig) {
	r.config.Store(&u)
}

// reconfigure sends the replica its config if it does not run it yet.
func (r *replica) reconfigure(ctx context.Context) error {
	want := r.config.Load()
	if want == nil || len(*want) == 0 || r.spec.ReconfigurePath == "" {
		return nil
	}
	version := want.Version()
	if applied, _ := r.a.state.configs.Load(r.tag); applied == version {
		return nil
	}
	if err := r.ownsPort(true); err != nil { // its secret goes with it
		return fmt.Errorf("user_config %s not sent: %w", version, err)
	}
	ctx, cancel := context.WithTimeout(ctx, reconfigureTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.address()+r.spec.ReconfigurePath, bytes.NewReader(*want))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.ConfigVersionHeader, version)
	req.Header.Set(wire.ReconfigureTokenHeader, r.reconfigureToken)
	resp, err := reconfigureClient.Do(req)
	if err != nil {
		return fmt.Errorf("user_config %s not taken at %s: %w", version, r.spec.ReconfigurePath, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return fmt.Errorf("user_config %s not taken at %s: status %d: %s", version, r.spec.ReconfigurePath, resp.StatusCode, bytes.TrimSpace(body))
	}
	r.a.state.configs.Store(r.tag, version)
	r.writeRecord() // an adopting agent need not send it again
	r.log.Info("replica took its user_config", "version", version)
	return nil
}
