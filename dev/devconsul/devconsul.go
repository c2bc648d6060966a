package devconsul

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/toolpath"
)

// Agent is a real `consul agent -dev` on loopback ports.
type Agent struct {
	// HTTPAddr is the agent's HTTP API address (host:port).
	HTTPAddr string
	child    *proc.Process
	log      string
	token    string    // the management token, with ACLs on
	spec     proc.Spec // how a cluster's agent is started (Restart)

	// transport is shared by every Client: a client of its own each
	// (a test's, run -count times) kept its idle connections open, and
	// Consul refuses a client address past 200 at once (429).
	transportOnce sync.Once
	transport     *http.Transport
}

// NodeName is the dev agent's Consul node name.
const NodeName = "servemesh-dev"

// Find returns the Consul binary: $SERVEMESH_CONSUL, else
// .tools/bin/consul, else $PATH (see package toolpath).
func Find() (string, error) { return toolpath.Find("consul", "SERVEMESH_CONSUL", "") }

// Start starts a dev agent logging into dir. Its HTTP API listens on
// httpPort (a free port when 0); its other ports are free ones. It fails
// rather than skips when Consul is missing.
func Start(dir string, httpPort int) (*Agent, error) {
	return StartWith(dir, Options{HTTPPort: httpPort})
}

// Options configure a dev agent.
type Options struct {
	// HTTPPort is the HTTP API's port; a free one when 0.
	HTTPPort int
	// ManagementToken, if set, turns ACLs on with default deny and makes
	// it the initial management token (and the agent's own).
	ManagementToken string
}

// StartWith starts a dev agent with o, logging into dir.
//
// Its ports are chosen free, then bound by Consul: another process can
// take one in between (a loaded machine running many tests side by side
// did). Then Consul exits saying so, and it is started again on new ports
// (unless o names the HTTP port), a few times.
func StartWith(dir string, o Options) (*Agent, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		c, err := start(bin, dir, o)
		if err == nil || o.HTTPPort != 0 || attempt == portAttempts || !errors.Is(err, errPortTaken) {
			return c, err
		}
	}
}

// choosePorts picks a dev agent's four ports (HTTP, Serf LAN and WAN,
// server), free now and none of them httpPort; a variable for tests.
var choosePorts = func(httpPort int) ([]int, error) {
	ports := make([]int, 0, 4)
	for len(ports) < 4 { // four different ports: a freed port can come back at once
		addr, err := proc.FreeAddr(context.Background(), "127.0.0.1")
		if err != nil {
			return nil, err
		}
		_, text, _ := net.SplitHostPort(addr)
		if port, _ := strconv.Atoi(text); !slices.Contains(ports, port) && port != httpPort {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// portAttempts bounds the starts of a dev agent whose ports were taken.
const portAttempts = 5

// errPortTaken is a start that failed because a port chosen free was
// taken before Consul bound it.
var errPortTaken = errors.New("a port chosen for consul was taken before it bound it")

// start starts a dev agent once, on ports chosen now.
func start(bin, dir string, o Options) (*Agent, error) {
	httpPort := o.HTTPPort
	ports, err := choosePorts(httpPort)
	if err != nil {
		return nil, err
	}
	if httpPort != 0 {
		ports[0] = httpPort
		// Another agent there would answer for this one, which would fail
		// to bind and exit, saying so only in its log.
		if err := proc.CheckFree(context.Background(), "consul's HTTP API", "127.0.0.1:"+strconv.Itoa(httpPort)); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(dir, "consul.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	c := &Agent{HTTPAddr: "127.0.0.1:" + strconv.Itoa(ports[0]), log: logPath, token: o.ManagementToken}
	args := []string{"agent", "-dev", "-node", NodeName,
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-http-port", strconv.Itoa(ports[0]), "-serf-lan-port", strconv.Itoa(ports[1]),
		"-serf-wan-port", strconv.Itoa(ports[2]), "-server-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1", "-log-level", "warn"}
	if o.ManagementToken != "" {
		args = append(args, "-hcl", fmt.Sprintf(`acl { enabled = true, default_policy = "deny", tokens { initial_management = %q, agent = %q } }`,
			o.ManagementToken, o.ManagementToken))
	}
	c.child, err = proc.Start(proc.Spec{Path: bin, Stdout: logFile, Stderr: logFile, Args: args})
	if err != nil {
		return nil, fmt.Errorf("consul: %w", err)
	}
	client, err := c.Client()
	if err != nil {
		c.Stop()
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c.child.Exited() {
			err := fmt.Errorf("consul exited (%w); log:\n%s", c.child.Wait(), c.LogTail())
			if strings.Contains(c.LogTail(), "bind: address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return nil, err
		}
		if c.hasLeader(client) && c.aclReady(client) {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("consul agent at %s elected no leader within 30s; log:\n%s", c.HTTPAddr, c.LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hasLeader reports whether the agent answers with a leader within a
// second (whatever holds its HTTP port may never answer).
func (c *Agent) hasLeader(client *api.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	leader, err := client.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
	return err == nil && leader != ""
}

// aclReady reports whether, with ACLs on, the leader knows the management
// token yet (it installs it just after its election): until then a call
// made with it is refused as "ACL not found".
func (c *Agent) aclReady(client *api.Client) bool {
	if c.token == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _, err := client.ACL().TokenReadSelf((&api.QueryOptions{}).WithContext(ctx))
	return err == nil
}

// Client returns an API client for the agent.
func (c *Agent) Client() (*api.Client, error) {
	c.transportOnce.Do(func() { c.transport = cleanhttp.DefaultPooledTransport() })
	cfg := api.DefaultConfig()
	cfg.Address = c.HTTPAddr
	cfg.Token = c.token
	cfg.Transport = c.transport
	return api.NewClient(cfg)
}

// Pid is the agent's process id (tests stop it with SIGSTOP).
func (c *Agent) Pid() int { return c.child.Pid() }

// Stop kills the agent.
func (c *Agent) Stop() {
	_ = c.child.Kill()
}

// LogTail returns the end of the agent's log.
func (c *Agent) LogTail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
