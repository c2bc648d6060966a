package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/controlplane/api"
	consulpolicy "github.com/servemesh/servemesh/deploy/consul"
	"github.com/servemesh/servemesh/dev/devconsul"
	"github.com/servemesh/servemesh/dev/devjaeger"
	"github.com/servemesh/servemesh/dev/devllama"
	"github.com/servemesh/servemesh/dev/devredis"
	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// StackOptions configure `servemesh demo-stack` (what `make run` starts).
type StackOptions struct {
	WorkDir        string
	ConsulHTTPPort int
	API, XDS       string
	Public, Mesh   string
	// Inbound is the node's inbound listener, where other nodes call its
	// replicas over mTLS.
	Inbound string
	// ModelServer is what serves the demo's llama model: StandIn (the
	// default) or Llama, the real engine.
	ModelServer string
	// engine is the real engine, found when ModelServer is Llama.
	engine *devllama.Engine
	// Self is the servemesh binary the controller, agent and replicas run.
	Self string
	// AllowCommands are the other commands the agent may run as replicas
	// (its --allow-command), such as a Python model's interpreter.
	AllowCommands []string
}

// RunStack runs the whole of servemesh on this machine, as it runs in
// production: a Consul dev agent (ACLs on with default deny, its
// service-mesh CA on), the controller, and one node agent with its Envoy
// running the demo's replicas as processes, in the default mode (xDS over
// TLS, calls between nodes over mTLS), each daemon with a Consul token of
// its own.
func RunStack(ctx context.Context, log *slog.Logger, o StackOptions, stdout io.Writer) error {
	// The daemons' paths (the rate limit service's among them) are the
	// same wherever each runs from.
	dir, err := filepath.Abs(o.WorkDir)
	if err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	o.WorkDir = dir
	switch o.ModelServer {
	case "", StandIn:
		o.ModelServer = StandIn
	case Llama:
		if o.engine, err = devllama.Find(); err != nil {
			return fmt.Errorf("--model-server %s: %w", Llama, err)
		}
	default:
		return fmt.Errorf("--model-server %q: give %s (the default) or %s (llama.cpp's server, which make tools builds)", o.ModelServer, StandIn, Llama)
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	unlock, err := lockStack(ctx, o)
	if err != nil {
		return err
	}
	defer unlock()
	management, _, err := stackSecret(o.WorkDir, stackConsulToken)
	if err != nil {
		return err
	}
	consul, err := devconsul.StartWith(o.WorkDir, devconsul.Options{HTTPPort: o.ConsulHTTPPort, ManagementToken: management})
	if err != nil {
		return fmt.Errorf("consul: %w", err)
	}
	defer consul.Stop()
	tokens, err := stackConsulTokens(ctx, consul, o.WorkDir)
	if err != nil {
		return err
	}
	// The store of the node's rate limit service (global limits).
	redis, passwordFile, err := startStackRedis(o.WorkDir)
	if err != nil {
		return err
	}
	defer redis.Stop()
	// The collector of the mesh's traces.
	jaeger, err := devjaeger.Start(ctx, filepath.Join(o.WorkDir, "jaeger"), "", "")
	if err != nil {
		return fmt.Errorf("jaeger: %w", err)
	}
	defer jaeger.Stop()
	children, err := startStackDaemons(o, consul.HTTPAddr, tokens, redis.Addr, passwordFile)
	defer func() {
		for _, c := range children {
			_ = c.Stop(15 * time.Second)
		}
	}()
	if err != nil {
		return err
	}
	meshFile, err := applyDemo(ctx, o, jaeger.OTLP, children)
	if err != nil {
		return err
	}
	if err := writeDemoPrompt(o.WorkDir); err != nil {
		return err
	}
	fmt.Fprint(stdout, stackHelp(o, consul.HTTPAddr, meshFile, jaeger.Query))
	// Each daemon runs until the demo stops; one that exits stops the demo,
	// saying which (its log is in the work folder).
	g, _ := rungroup.New(ctx)
	for i, name := range []string{"controller", "agent"} {
		child := children[i]
		g.Go(name, func(ctx context.Context) error {
			select {
			case <-child.Done():
				err := child.Wait()
				if err == nil {
					err = errors.New("exit status 0")
				}
				return fmt.Errorf("exited, see %s: %w", filepath.Join(o.WorkDir, name+".log"), err)
			case <-ctx.Done():
				return nil
			}
		})
	}
	err = g.Wait()
	log.Info("stopping the demo")
	return err
}

// stackLock, in the demo's work folder, is held by the demo-stack that
// runs there.
const stackLock = "demo-stack.lock"

// lockStack makes sure no other demo-stack (or anything else) has the
// demo's work folder or addresses before it starts or truncates anything:
// a second one would take the first's node id, replicas and logs.
func lockStack(ctx context.Context, o StackOptions) (func(), error) {
	unlock, err := proc.Lock(filepath.Join(o.WorkDir, stackLock))
	var held *proc.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("another demo-stack, %s, runs in %s: stop it (Ctrl-C in its terminal, or kill %d), or start this one with another --work-dir and other ports (--consul-http-port, --api, --xds, --public, --mesh, --inbound)",
			held.Holder, o.WorkDir, held.Holder.PID)
	}
	if err != nil {
		return nil, err
	}
	for _, a := range []struct{ what, addr, flag string }{
		{"consul's HTTP API", "127.0.0.1:" + strconv.Itoa(o.ConsulHTTPPort), "--consul-http-port"},
		{"the controller's API", o.API, "--api"},
		{"the controller's xDS", o.XDS, "--xds"},
		{"the node's public listener", o.Public, "--public"},
		{"the node's mesh listener", o.Mesh, "--mesh"},
		{"the node's inbound listener", o.Inbound, "--inbound"},
	} {
		if a.addr == "" || strings.HasSuffix(a.addr, ":0") {
			continue
		}
		if err := proc.CheckFree(ctx, a.what, a.addr); err != nil {
			unlock()
			return nil, fmt.Errorf("%w: is another servemesh running? Stop it, or give this demo %s another address", err, a.flag)
		}
	}
	return unlock, nil
}

// demoNode is the demo's node's id.
const demoNode = "demo-node"

// stackConsulToken is the file, in the demo's work folder, of its Consul's
// management token (the UI's login, and the consul command's).
const stackConsulToken = "consul-management.token"

// stackConsulTokens mints the controller's and the node's Consul tokens
// from deploy/consul's policies, each in its own file of the work folder
// (0600): the files by daemon name.
func stackConsulTokens(ctx context.Context, consul *devconsul.Agent, dir string) (map[string]string, error) {
	admin, err := consul.Client()
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for name, r := range map[string]devconsul.TokenRequest{
		"controller": {Description: "servemesh controller", Policy: "servemesh-controller", Rules: consulpolicy.ControllerPolicy(devconsul.NodeName)},
		"agent": {Description: "servemesh node " + demoNode, Policy: "servemesh-node", Rules: consulpolicy.NodePolicy(),
			ConsulNode: devconsul.NodeName, Service: wire.NodeService(demoNode)},
	} {
		token, err := devconsul.MintToken(ctx, admin, r)
		if err != nil {
			return nil, err
		}
		files[name] = filepath.Join(dir, name+"-consul.token")
		if err := os.WriteFile(files[name], []byte(token), 0o600); err != nil {
			return nil, fmt.Errorf("%s's consul token: %w", name, err)
		}
	}
	return files, nil
}

// startStackDaemons starts the controller and the agent, logging into the
// work folder, each with its Consul token file; it returns those it
// started.
func startStackDaemons(o StackOptions, consulAddr string, consulTokens map[string]string, redis, redisPasswordFile string) ([]*proc.Process, error) {
	var env []string
	for _, kv := range os.Environ() { // the user's own Consul token is not the daemons'
		if !strings.HasPrefix(kv, "CONSUL_HTTP_TOKEN") {
			env = append(env, kv)
		}
	}
	env = append(env, "CONSUL_HTTP_ADDR="+consulAddr)
	// The agent serves its replicas' and Envoy's logs only to this token,
	// which the controller sends: no other user of the host reads them.
	_, statusToken, err := stackSecret(o.WorkDir, "agent-status.token")
	if err != nil {
		return nil, err
	}
	var started []*proc.Process
	for _, d := range []struct {
		name string
		args []string
	}{
		{"controller", []string{"controller", "--allow-replica-cidr", "127.0.0.0/8", "--api-listen", o.API, "--xds-listen", o.XDS, "--replace-after", "10s", "--drain-grace", "2s",
			"--agent-token-file", statusToken}},
		{"agent", []string{"agent", "--node-id", demoNode, "--address", "127.0.0.1", "--cpus", strconv.Itoa(DemoNodeCPUs), "--memory-mb", "8192",
			"--xds", o.XDS, "--public", o.Public, "--mesh", o.Mesh, "--inbound", o.Inbound,
			"--work-dir", filepath.Join(o.WorkDir, "agent"), "--drain-grace", "2s", "--stop-on-exit", "--allow-command", o.Self,
			"--rate-limit-redis", redis, "--rate-limit-redis-password-file", redisPasswordFile, "--status-token-file", statusToken,
			// The demo's replicas are this binary, wherever the checkout is:
			// they run as the user who started the demo, on one trusted host.
			"--run-as", currentUser()}},
	} {
		if d.name == "agent" && o.engine != nil {
			d.args = append(d.args, o.engine.AllowFlags()...)
		}
		if d.name == "agent" {
			for _, c := range o.AllowCommands {
				d.args = append(d.args, "--allow-command", c)
			}
		}
		logFile, err := os.Create(filepath.Join(o.WorkDir, d.name+".log"))
		if err != nil {
			return started, err
		}
		p, err := proc.Start(proc.Spec{Path: o.Self, Args: d.args, Env: append(env, "CONSUL_HTTP_TOKEN_FILE="+consulTokens[d.name]), Stdout: logFile, Stderr: logFile})
		_ = logFile.Close()
		if err != nil {
			return started, fmt.Errorf("start %s: %w", d.name, err)
		}
		started = append(started, p)
	}
	return started, nil
}

// stackSecret writes a new random secret into the work folder's file
// name, readable by the demo's user alone, and returns it and the file.
func stackSecret(dir, name string) (secret, file string, err error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("%s: %w", name, err)
	}
	secret, file = hex.EncodeToString(b), filepath.Join(dir, name)
	if err := os.WriteFile(file, []byte(secret), 0o600); err != nil {
		return "", "", fmt.Errorf("%s: %w", name, err)
	}
	return secret, file, nil
}

// startStackRedis starts the demo's Redis on a free loopback port with a
// new random password, kept in the work folder (0600) for the agent.
func startStackRedis(dir string) (*devredis.Server, string, error) {
	password, file, err := stackSecret(dir, "redis-password")
	if err != nil {
		return nil, "", fmt.Errorf("redis password: %w", err)
	}
	redis, err := devredis.Start(dir, 0, password)
	if err != nil {
		return nil, "", fmt.Errorf("redis: %w", err)
	}
	return redis, file, nil
}

// applyDemo applies the demo's state (its traces sent to collector) once
// the controller and the agent are up, writes it to mesh.yaml for the user
// to edit, and waits until it is served, every replica ready.
func applyDemo(ctx context.Context, o StackOptions, collector string, children []*proc.Process) (string, error) {
	// A daemon that exits while the demo comes up ends it at once, with
	// its log (another one listening where it would must not pass for it).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	for i, name := range []string{"controller", "agent"} {
		go func() {
			select {
			case <-children[i].Done():
				log := filepath.Join(o.WorkDir, name+".log")
				cancel(fmt.Errorf("the %s exited (%w); the end of %s:\n%s", name, children[i].Wait(), log, proc.LogTail(log, 2048)))
			case <-ctx.Done():
			}
		}()
	}
	client := api.NewClient(o.API, "")
	m := StackModel(o.Self, o.engine)
	m.Mesh = &meshspec.Mesh{Tracing: &meshspec.Tracing{Collector: collector, SamplingPercent: &demoSampling}}
	// Process backends need a live node: retry until the agent has registered.
	if err := poll(ctx, 60*time.Second, func() bool { _, err := client.Apply(ctx, meshspec.SpecOf(m), api.ApplyOptions{}); return err == nil }); err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return "", fmt.Errorf("the controller and agent did not come up (see %s/*.log): %w", o.WorkDir, err)
	}
	out, err := meshspec.MarshalSpec(meshspec.SpecOf(m)) // what users write, as they write it
	if err != nil {
		return "", err
	}
	meshFile := filepath.Join(o.WorkDir, "mesh.yaml")
	if err := os.WriteFile(meshFile, out, 0o644); err != nil {
		return "", err
	}
	// Every line the banner prints works once it is printed: every node
	// serves the state and every backend's replicas are ready (a real
	// engine takes some seconds to load its model).
	endpoints := make([]string, len(m.Endpoints))
	for i, e := range m.Endpoints {
		endpoints[i] = e.Name
	}
	waitCtx, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	if err := client.WaitServed(waitCtx, api.ServedQuery{Endpoints: endpoints}, nil); err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return "", fmt.Errorf("the demo's state was not served (see %s/*.log): %w", o.WorkDir, err)
	}
	return meshFile, nil
}

// currentUser is this process's user id, for --run-as.
func currentUser() string { return strconv.Itoa(os.Getuid()) }

// poll checks cond every 200ms until it holds, timeout passes or ctx ends.
func poll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		if !backoff.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}
