package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/model"
)

// Client calls a controller's API. It tries its controllers in turn when one
// cannot be reached, and retries a write once at the leader a follower names.
type Client struct {
	bases []string
	token string
	http  *http.Client
}

// NewClient returns a client for the controllers at servers, one address or
// several comma-separated ("127.0.0.1:18001" or "http://host:port"),
// authenticating with token if it is not empty.
func NewClient(servers, token string) *Client {
	c := &Client{token: token, http: &http.Client{Timeout: 30 * time.Second}}
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

// Error is an error answer from the controller.
type Error struct {
	Status int
	Body   ErrorBody
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s (HTTP %d)", e.Body.Error, e.Status)
	if e.Body.Kind == "not_leader" && e.Body.Leader != "" {
		msg += "; the leader is " + e.Body.Leader
	}
	return msg
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var err error
	for _, base := range c.bases {
		err = c.doAt(ctx, base, method, path, body, out)
		var apiErr *Error
		if method != http.MethodGet && asError(err, &apiErr) && apiErr.Body.Kind == "not_leader" && apiErr.Body.Leader != "" {
			if leader := normalize(apiErr.Body.Leader); leader != base {
				return c.doAt(ctx, leader, method, path, body, out)
			}
		}
		if !isConnectError(err) {
			return err
		}
	}
	return err
}

// isConnectError reports whether err means the controller could not be
// reached at all, so another one may be tried.
func isConnectError(err error) bool {
	var apiErr *Error
	return err != nil && !errors.As(err, &apiErr) && ctxErr(err) == nil
}

func ctxErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func asError(err error, target **Error) bool { return errors.As(err, target) }

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
		return fmt.Errorf("%s %s: %w", method, base+path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
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
func (c *Client) ListBackends(ctx context.Context) ([]model.Backend, error) {
	var out []model.Backend
	return out, c.do(ctx, http.MethodGet, "/v1/backends", nil, &out)
}

// GetBackend returns one backend.
func (c *Client) GetBackend(ctx context.Context, name string) (model.Backend, error) {
	var out model.Backend
	return out, c.do(ctx, http.MethodGet, "/v1/backends/"+esc(name), nil, &out)
}

// CreateBackend creates a backend; it reports whether anything changed.
func (c *Client) CreateBackend(ctx context.Context, b model.Backend) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, "/v1/backends", b, &out)
}

// UpdateBackend changes the set fields of a backend's config.
func (c *Client) UpdateBackend(ctx context.Context, name string, p model.BackendConfigPatch) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPatch, "/v1/backends/"+esc(name), p, &out)
}

// DeleteBackend deletes a backend.
func (c *Client) DeleteBackend(ctx context.Context, name string) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodDelete, "/v1/backends/"+esc(name), nil, &out)
}

// ListEndpoints lists every endpoint.
func (c *Client) ListEndpoints(ctx context.Context) ([]model.Endpoint, error) {
	var out []model.Endpoint
	return out, c.do(ctx, http.MethodGet, "/v1/endpoints", nil, &out)
}

// GetEndpoint returns one endpoint.
func (c *Client) GetEndpoint(ctx context.Context, name string) (model.Endpoint, error) {
	var out model.Endpoint
	return out, c.do(ctx, http.MethodGet, "/v1/endpoints/"+esc(name), nil, &out)
}

// CreateEndpoint creates an endpoint.
func (c *Client) CreateEndpoint(ctx context.Context, e model.Endpoint) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPost, "/v1/endpoints", e, &out)
}

// DeleteEndpoint deletes an endpoint.
func (c *Client) DeleteEndpoint(ctx context.Context, name string) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodDelete, "/v1/endpoints/"+esc(name), nil, &out)
}

// SetTraffic sets an endpoint's traffic weights.
func (c *Client) SetTraffic(ctx context.Context, endpoint string, traffic map[string]float64) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPut, "/v1/endpoints/"+esc(endpoint)+"/traffic", TrafficRequest{Traffic: traffic}, &out)
}

// SetShadow mirrors proportion of an endpoint's requests to backend.
func (c *Client) SetShadow(ctx context.Context, endpoint, backend string, proportion float64) (bool, error) {
	var out Changed
	return out.Changed, c.do(ctx, http.MethodPut, "/v1/endpoints/"+esc(endpoint)+"/shadows/"+esc(backend), ShadowRequest{Proportion: &proportion}, &out)
}

// Apply makes the state equal m (or, with dryRun, only reports the changes).
func (c *Client) Apply(ctx context.Context, m *model.Model, dryRun bool) (ApplyResult, error) {
	var out ApplyResult
	path := "/v1/apply"
	if dryRun {
		path += "?dry_run=true"
	}
	return out, c.do(ctx, http.MethodPost, path, m, &out)
}

// Leader reports whether the controller leads, and who does.
func (c *Client) Leader(ctx context.Context) (LeaderInfo, error) {
	var out LeaderInfo
	return out, c.do(ctx, http.MethodGet, "/v1/leader", nil, &out)
}

// ReadTokenFile reads a bearer token from a file; an empty path means no
// token.
func ReadTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty; put the token in it", path)
	}
	return token, nil
}
