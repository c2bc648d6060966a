package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/controller"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/meshspec"
)

// Client calls a controllers' API. A call that reached no leader (no
// controller could be reached, a follower answered that it does not lead)
// or whose answer was lost (the leader died mid-call) is sent again: every
// call of the API is idempotent, so repeating one that did land changes
// nothing. The client tries its other controllers, starting with the
// leader a follower names if it is one of them, and waits with backoff for
// a leader for up to FailoverWait, so a script rides through a leader's
// failover. It never sends its token to an address it was not given.
type Client struct {
	bases []string
	token string
	http  *http.Client
	// FailoverWait bounds how long a call waits for a controller that
	// leads (and answers); NewClient sets DefaultFailoverWait, and zero
	// tries each controller once. With one controller that nothing
	// answers at, a call fails at once.
	FailoverWait time.Duration
	// Waiting, if set, hears once per call that it waits for a leader, why
	// (the last error), and for how long at most.
	Waiting func(why error, upTo time.Duration)
}

// DefaultFailoverWait is a little longer than a leader's takeover after it
// dies (its check's TTL of 3 s, then the 1 s lock delay, then recovery).
const DefaultFailoverWait = 15 * time.Second

// NewClient returns a client for the controllers at servers, one address or
// several comma-separated ("127.0.0.1:18001" or "http://host:port"),
// authenticating with token if it is not empty.
func NewClient(servers, token string) *Client {
	c := &Client{token: token, FailoverWait: DefaultFailoverWait, http: &http.Client{Timeout: 30 * time.Second,
		CheckRedirect: httpserver.NoRedirects}}
	for _, s := range strings.Split(servers, ",") {
		c.bases = append(c.bases, normalize(s))
	}
	return c
}

func normalize(addr string) string {
	addr = strings.TrimSpace(addr)
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/")
}

// TrustCA makes the client verify HTTPS controllers against the PEM
// certificates in caPEM instead of the system's roots.
func (c *Client) TrustCA(caPEM []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("the CA file holds no PEM certificate")
	}
	c.http.Transport = &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}
	return nil
}

// Error is an error answer from the controller.
type Error struct {
	Status int
	Body   ErrorBody
}

// Error is the controller's message: what is wrong and how to fix it
// (Detail adds the HTTP status and the error's kind).
func (e *Error) Error() string {
	msg := e.Body.Error
	if e.Body.Kind == "not_leader" && e.Body.Leader != "" {
		msg += "; the leader is " + e.Body.Leader
	}
	return msg
}

// Detail is the answer's HTTP status and the error's kind, as a verbose
// CLI prints them after the message: "HTTP 404, not_found".
func (e *Error) Detail() string {
	if e.Body.Kind == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d, %s", e.Status, e.Body.Kind)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	deadline := time.Now().Add(c.FailoverWait)
	delay := 100 * time.Millisecond
	order := append([]string(nil), c.bases...)
	waited := false
	for {
		var err error
		var unknownLeader string
		for i := 0; i < len(order); i++ {
			err = c.doAt(ctx, order[i], method, path, body, out)
			if !retryable(err) {
				return err
			}
			if leader := namedLeader(err); leader != "" {
				if j := slices.Index(order, leader); j > i {
					order[i+1], order[j] = order[j], order[i+1] // ask the named leader next
				} else if j < 0 {
					unknownLeader = leader
				}
			}
		}
		if unknownLeader != "" && len(c.bases) == 1 {
			return fmt.Errorf("%w; it is not among the controllers this client was given (--server), so the token is not sent there; add it", err)
		}
		if len(c.bases) == 1 && errors.Is(err, ErrUnreachable) {
			return err // nothing to fail over to, and nothing listens: say so now
		}
		if time.Now().Add(delay).After(deadline) {
			return err
		}
		if !waited && c.Waiting != nil {
			c.Waiting(err, time.Until(deadline).Round(100*time.Millisecond))
		}
		waited = true
		select { // no controller leads yet: wait for a takeover
		case <-ctx.Done():
			return fmt.Errorf("%w (then: %w)", err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// retryable reports whether err means the call reached no leader (no
// controller could be connected to, a follower answered that it does not
// lead) or its answer was lost on the way (the connection broke). Errors
// the controller answered, and the caller's own deadline, are final.
func retryable(err error) bool {
	if err == nil || ctxErr(err) != nil {
		return false
	}
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr.Body.Kind == "not_leader"
	}
	var transport *transportError
	return errors.As(err, &transport) // refused, reset, EOF
}

// namedLeader is the leader a follower's answer names, normalised; "" if
// none.
func namedLeader(err error) string {
	var apiErr *Error
	if errors.As(err, &apiErr) && apiErr.Body.Kind == "not_leader" && apiErr.Body.Leader != "" {
		return normalize(apiErr.Body.Leader)
	}
	return ""
}

func ctxErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (c *Client) doAt(ctx context.Context, base, method, path string, body, out any) error {
	var reader io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		reader = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, reader)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return explain(method, path, base, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		if err := explainAnswer(method, path, base, resp.StatusCode, string(data)); err != nil {
			return err
		}
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, &e.Body) != nil || e.Body.Error == "" {
			e.Body.Error = strings.TrimSpace(string(data))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// ListBackends lists every backend.
func (c *Client) ListBackends(ctx context.Context) ([]meshspec.Backend, error) {
	var out []meshspec.Backend
	return out, c.do(ctx, http.MethodGet, "/v1/backends", nil, &out)
}

// GetBackend returns one backend.
func (c *Client) GetBackend(ctx context.Context, name string) (meshspec.Backend, error) {
	var out meshspec.Backend
	return out, c.do(ctx, http.MethodGet, "/v1/backends/"+esc(name), nil, &out)
}

// CreateBackend creates a backend; it reports whether anything changed.
func (c *Client) CreateBackend(ctx context.Context, b meshspec.BackendSpec) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, "/v1/backends", b, &out)
}

// UpdateBackend changes the set fields of a backend's config.
func (c *Client) UpdateBackend(ctx context.Context, name string, p meshspec.BackendConfigPatch) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPatch, "/v1/backends/"+esc(name), p, &out)
}

// PatchBackend merges patch into a backend's config (a JSON merge patch,
// RFC 7386: a nil value removes its field, a map merges); it reports
// whether anything changed.
func (c *Client) PatchBackend(ctx context.Context, name string, patch map[string]any) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPatch, "/v1/backends/"+esc(name), patch, &out)
}

// DeleteBackend deletes a backend.
func (c *Client) DeleteBackend(ctx context.Context, name string) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodDelete, "/v1/backends/"+esc(name), nil, &out)
}

// ListEndpoints lists every endpoint.
func (c *Client) ListEndpoints(ctx context.Context) ([]meshspec.Endpoint, error) {
	var out []meshspec.Endpoint
	return out, c.do(ctx, http.MethodGet, "/v1/endpoints", nil, &out)
}

// GetEndpoint returns one endpoint.
func (c *Client) GetEndpoint(ctx context.Context, name string) (meshspec.Endpoint, error) {
	var out meshspec.Endpoint
	return out, c.do(ctx, http.MethodGet, "/v1/endpoints/"+esc(name), nil, &out)
}

// CreateEndpoint creates an endpoint.
func (c *Client) CreateEndpoint(ctx context.Context, e meshspec.Endpoint) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, "/v1/endpoints", e, &out)
}

// PatchEndpoint merges patch (a JSON merge patch of the endpoint's
// fields; nil removes one) into an endpoint.
func (c *Client) PatchEndpoint(ctx context.Context, name string, patch map[string]any) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPatch, "/v1/endpoints/"+esc(name), patch, &out)
}

// DeleteEndpoint deletes an endpoint.
func (c *Client) DeleteEndpoint(ctx context.Context, name string) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodDelete, "/v1/endpoints/"+esc(name), nil, &out)
}

// SetTraffic sets an endpoint's traffic weights.
func (c *Client) SetTraffic(ctx context.Context, endpoint string, traffic map[string]float64) (bool, error) {
	return c.SetModelTraffic(ctx, endpoint, "", traffic)
}

// SetModelTraffic replaces the split of one model of an endpoint routed
// by model ("": the endpoint's own split).
func (c *Client) SetModelTraffic(ctx context.Context, endpoint, model string, traffic map[string]float64) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPut, "/v1/endpoints/"+esc(endpoint)+"/traffic", TrafficRequest{Traffic: traffic, Model: model}, &out)
}

// SetShadow mirrors proportion of an endpoint's requests to backend.
func (c *Client) SetShadow(ctx context.Context, endpoint, backend string, proportion float64) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPut, "/v1/endpoints/"+esc(endpoint)+"/shadows/"+esc(backend), ShadowRequest{Proportion: &proportion}, &out)
}

// ApplyOptions are how an apply goes (dry run, pruning ended rollouts).
type ApplyOptions = controller.ApplyOptions

// Apply makes the state equal m (or, with opts.DryRun, only reports the
// changes).
func (c *Client) Apply(ctx context.Context, m *meshspec.Spec, opts ApplyOptions) (ApplyResult, error) {
	var out ApplyResult
	q := url.Values{}
	if opts.DryRun {
		q.Set("dry_run", "true")
	}
	if opts.PruneRollouts {
		q.Set("prune_rollouts", "true")
	}
	if opts.Merge {
		q.Set("merge", "true")
	}
	path := "/v1/apply"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return out, c.do(ctx, http.MethodPost, path, m, &out)
}

// Leader reports whether the controller leads, and who does.
func (c *Client) Leader(ctx context.Context) (LeaderInfo, error) {
	var out LeaderInfo
	return out, c.do(ctx, http.MethodGet, "/v1/leader", nil, &out)
}

// ReadTokenFile reads a bearer token from a file (its first 64 KiB,
// trimmed); an empty path means no token. A file other users may read or
// write is refused, as ssh refuses such a key.
func ReadTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if mode := fi.Mode().Perm(); mode&0o077 != 0 {
		return "", fmt.Errorf("token file %s can be read or written by other users (mode %04o), who could use its token; make it the owner's alone: chmod 600 %s", path, mode, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty; put the token in it", path)
	}
	return token, nil
}
