package devconsul

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/proc"
)

// Cluster is a Consul cluster as production runs it, on loopback
// addresses: servers (Raft, data on disk, the Connect CA on) and a client
// agent for each address that runs servemesh daemons, which talk to their
// own client agent. Every agent listens on its own address with Consul's
// default ports, so the cluster needs addresses no other agent uses.
type Cluster struct {
	Servers []*Agent
	// Clients are the client agents by address.
	Clients map[string]*Agent
	dir     string
	token   string
	joins   []string
}

// ClusterOptions shape a cluster.
type ClusterOptions struct {
	// ServerAddrs are the servers' addresses (three or five).
	ServerAddrs []string
	// ClientAddrs are the addresses of the client agents.
	ClientAddrs []string
	// ManagementToken turns ACLs on with default deny; every agent uses it
	// as its own agent token.
	ManagementToken string
}

// StartCluster starts the servers, waits for a leader, then the clients.
func StartCluster(dir string, o ClusterOptions) (*Cluster, error) {
	if len(o.ServerAddrs) == 0 || len(o.ClientAddrs) == 0 {
		return nil, errors.New("devconsul: a cluster needs servers and clients")
	}
	c := &Cluster{Clients: map[string]*Agent{}, dir: dir, token: o.ManagementToken}
	for _, a := range o.ServerAddrs {
		c.joins = append(c.joins, "-retry-join", a)
	}
	for i, addr := range o.ServerAddrs {
		s, err := c.start(fmt.Sprintf("server-%d", i+1), addr, true, len(o.ServerAddrs))
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
	}
	for _, addr := range o.ClientAddrs {
		a, err := c.start(ClientNodeName(addr), addr, false, 0)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Clients[addr] = a
	}
	for _, a := range c.all() {
		if err := a.waitReady(60 * time.Second); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// start starts one agent of the cluster.
func (c *Cluster) start(node, addr string, server bool, expect int) (*Agent, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(c.dir, node)
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	a := &Agent{HTTPAddr: addr + ":8500", log: filepath.Join(data, "consul.log"), token: c.token,
		spec: proc.Spec{Path: bin}}
	args := []string{"agent", "-node", node, "-bind", addr, "-client", addr, "-data-dir", data,
		"-dns-port", "-1", "-grpc-port", "-1", "-log-level", "warn"}
	args = append(args, c.joins...)
	hcl := "disable_update_check = true "
	if server {
		args = append(args, "-server", "-bootstrap-expect", fmt.Sprint(expect))
		hcl = `connect { enabled = true } `
	}
	if c.token != "" {
		hcl += fmt.Sprintf(`acl { enabled = true, default_policy = "deny", tokens { initial_management = %q, agent = %q } }`, c.token, c.token)
	}
	args = append(args, "-hcl", hcl)
	a.spec.Args = args
	return a, a.run()
}

// ClientNodeName is the Consul node name of the client agent on addr.
func ClientNodeName(addr string) string { return "client-" + strings.ReplaceAll(addr, ".", "-") }

// all lists every agent of the cluster.
func (c *Cluster) all() []*Agent {
	out := append([]*Agent(nil), c.Servers...)
	for _, a := range c.Clients {
		out = append(out, a)
	}
	return out
}

// Leader returns the server that leads, as the cluster says.
func (c *Cluster) Leader() (*Agent, error) {
	for _, s := range c.Servers {
		client, err := s.Client()
		if err != nil {
			continue
		}
		leader, err := client.Status().Leader()
		if err != nil || leader == "" {
			continue
		}
		host, _, _ := net.SplitHostPort(leader)
		for _, t := range c.Servers {
			if h, _, _ := net.SplitHostPort(t.HTTPAddr); h == host {
				return t, nil
			}
		}
	}
	return nil, errors.New("devconsul: no server leads")
}

// Stop kills every agent.
func (c *Cluster) Stop() {
	for _, a := range c.all() {
		a.Stop()
	}
}

// run starts the agent's process, logging into its log file.
func (c *Agent) run() error {
	logFile, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()
	spec := c.spec
	spec.Stdout, spec.Stderr = logFile, logFile
	if c.child, err = proc.Start(spec); err != nil {
		return fmt.Errorf("consul: %w", err)
	}
	return nil
}

// Restart starts again an agent of a cluster that was stopped, with its
// data, and waits until it is ready.
func (c *Agent) Restart(timeout time.Duration) error {
	if err := c.run(); err != nil {
		return err
	}
	return c.waitReady(timeout)
}

// waitReady waits until the agent knows a leader (and, with ACLs on, its
// token works).
func (c *Agent) waitReady(timeout time.Duration) error {
	client, err := c.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		if c.child.Exited() { // another agent may answer on its address
			return fmt.Errorf("consul agent for %s exited (%w); log:\n%s", c.HTTPAddr, c.child.Wait(), c.LogTail())
		}
		if leader, err := client.Status().Leader(); err == nil && leader != "" && c.aclReady(client) && c.joined(client) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consul agent at %s not ready within %s; log:\n%s", c.HTTPAddr, timeout, c.LogTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// joined reports whether the agent's own node is in the catalog.
func (c *Agent) joined(client *api.Client) bool {
	self, err := client.Agent().NodeName()
	if err != nil {
		return false
	}
	n, _, err := client.Catalog().Node(self, nil)
	return err == nil && n != nil
}
