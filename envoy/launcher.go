package envoy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/wire"
)

// LogFile is the Envoy's log in its WorkDir.
const LogFile = "envoy.log"

// Launcher is how to run one node's Envoy: its bootstrap and its process.
type Launcher struct {
	// Bootstrap is the node's identity, listeners and control plane.
	Bootstrap bootstrap.Options
	// Binary is an explicit Envoy path; empty means Find's search.
	Binary string
	// WorkDir receives bootstrap.yaml and envoy.log, and is Envoy's working
	// directory: a node's secrets are in its wire.SecretsDir.
	WorkDir     string
	LogLevel    string
	Concurrency int
	// Drain is how long listeners drain when Envoy stops.
	Drain time.Duration
	// UpgradeGrace is how long an Envoy replaced by a hot restart serves
	// the requests it has open after its drain (Config.UpgradeGrace).
	UpgradeGrace time.Duration
	Logger       *slog.Logger
	// PublicCert and PublicKey, if set, are PEM files of the public
	// listener's certificate chain and key: it then serves HTTPS, and Envoy
	// reloads them when a file is moved into their folder (replace them by
	// rename, as Kubernetes does with secrets).
	PublicCert, PublicKey string
	// StopOnExit stops the node's Envoy when its supervisor stops;
	// otherwise it serves on, for the next supervisor to adopt or hot
	// restart.
	StopOnExit bool
	// Parent is the servemesh binary, to parent the node's Envoy (its
	// envoy-parent command) so that it outlives its supervisor and can be
	// hot restarted; empty, the Envoy dies with its supervisor and is never
	// hot restarted.
	Parent string
}

// StateFile is where a node's supervisor writes down its Envoy, in the
// work folder.
const StateFile = "envoy-process.json"

// Prepare finds and checks Envoy, renders the node's bootstrap into
// WorkDir, and returns the Config that runs it.
func (l Launcher) Prepare(ctx context.Context) (Config, error) {
	binary, err := Find(l.Binary)
	if err != nil {
		return Config{}, err
	}
	v, err := CheckVersion(ctx, binary)
	if err != nil {
		return Config{}, err
	}
	if err := os.MkdirAll(l.WorkDir, 0o755); err != nil {
		return Config{}, fmt.Errorf("envoy work dir: %w", err)
	}
	if l.WorkDir, err = filepath.Abs(l.WorkDir); err != nil { // Envoy runs there
		return Config{}, fmt.Errorf("envoy work dir: %w", err)
	}
	if err := l.writePublicTLS(); err != nil {
		return Config{}, err
	}
	if err := l.adminFolder(); err != nil {
		return Config{}, err
	}
	if !l.Bootstrap.Node.NoAccessLog {
		if err := PrepareAccessLog(filepath.Join(l.WorkDir, wire.AccessLogFile)); err != nil {
			return Config{}, err
		}
	}
	yaml, err := bootstrap.YAML(l.Bootstrap)
	if err != nil {
		return Config{}, err
	}
	path := filepath.Join(l.WorkDir, "bootstrap.yaml")
	if err := os.WriteFile(path, yaml, 0o644); err != nil {
		return Config{}, fmt.Errorf("write bootstrap: %w", err)
	}
	l.Logger.Info("envoy prepared", "binary", binary, "version", v, "bootstrap", path)
	return Config{
		Binary: binary, ConfigPath: path, Dir: l.WorkDir, AdminSocket: l.Bootstrap.AdminSocket,
		LogPath: filepath.Join(l.WorkDir, LogFile), LogLevel: l.LogLevel,
		Concurrency: l.Concurrency, DrainTime: l.Drain, UpgradeGrace: l.UpgradeGrace, Logger: l.Logger,
	}, nil
}

// AdminSocket is where the node's Envoy serves its admin API: the given
// socket, or AdminSocketIn the work folder.
func (l Launcher) AdminSocket() string {
	if l.Bootstrap.AdminSocket != "" {
		return l.Bootstrap.AdminSocket
	}
	return AdminSocketIn(l.WorkDir)
}

// AdminSocketIn is the admin API's socket in a node's work folder, when the
// node is given none: in a folder of its own (AdminSocketFolder).
func AdminSocketIn(workDir string) string {
	return filepath.Join(workDir, AdminSocketFolder, "envoy.sock")
}

// AdminSocketFolder is the work folder's folder for the admin socket.
const AdminSocketFolder = "admin"

// adminFolder puts the admin socket (AdminSocketIn the work folder unless
// given) in a folder only the node's user may enter (0700): whoever reaches
// the socket controls Envoy, and replicas run as other users.
func (l *Launcher) adminFolder() error {
	l.Bootstrap.AdminSocket = l.AdminSocket()
	dir := filepath.Dir(l.Bootstrap.AdminSocket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("the admin socket's folder: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("the admin socket's folder: %w", err)
	}
	return nil
}

// HotRestartFolder is the work folder's folder for the hot restart's
// sockets (Config.SocketPath).
const HotRestartFolder = "hot-restart"

// hotRestartSockets makes, in workDir, the folder of the hot restart's
// sockets, which only the node's user may enter (0700), and returns their
// path (Config.SocketPath) relative to workDir, Envoy's working folder: a
// Unix socket's path has at most 107 bytes, which a work folder's path
// and the role and base id Envoy appends ("_udp_parent_" and up to 20
// digits) could pass.
func hotRestartSockets(workDir string) (string, error) {
	dir := filepath.Join(workDir, HotRestartFolder)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("the hot restart sockets' folder: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("the hot restart sockets' folder: %w", err)
	}
	return filepath.Join(HotRestartFolder, "envoy"), nil
}

// writePublicTLS writes the file-based SDS config of the public listener's
// certificate into the work folder and names it in the bootstrap, when a
// certificate is given.
func (l *Launcher) writePublicTLS() error {
	if l.PublicCert == "" && l.PublicKey == "" {
		return nil
	}
	cert, err1 := filepath.Abs(l.PublicCert)
	key, err2 := filepath.Abs(l.PublicKey)
	if l.PublicCert == "" || l.PublicKey == "" || err1 != nil || err2 != nil {
		return fmt.Errorf("the public listener's TLS needs both a certificate and a key file")
	}
	for _, f := range []string{cert, key} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("public TLS: %w", err)
		}
	}
	out, err := sdsConfig(&tlsv3.Secret{Name: wire.PublicTLSSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &core.DataSource{Specifier: &core.DataSource_Filename{Filename: cert}},
		PrivateKey:       &core.DataSource{Specifier: &core.DataSource_Filename{Filename: key}},
		WatchedDirectory: &core.WatchedDirectory{Path: filepath.Dir(cert)},
	}}})
	if err != nil {
		return fmt.Errorf("public TLS: %w", err)
	}
	path, err := filepath.Abs(filepath.Join(l.WorkDir, "public-tls-sds.yaml"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		return fmt.Errorf("write the public TLS secret config: %w", err)
	}
	l.Bootstrap.Node.PublicTLS = path
	return nil
}

// Supervise prepares the node and returns a supervisor for its Envoy that
// logs each start's readiness.
func (l Launcher) Supervise(ctx context.Context) (*Supervisor, error) {
	cfg, err := l.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	if l.Parent != "" {
		cfg.HotRestart, cfg.Parent, cfg.BaseIDPath = true, l.Parent, filepath.Join(cfg.Dir, baseIDFile)
		if cfg.SocketPath, err = hotRestartSockets(cfg.Dir); err != nil {
			return nil, err
		}
	}
	return &Supervisor{Config: cfg, Drain: l.Drain, StateFile: filepath.Join(cfg.Dir, StateFile), StopOnExit: l.StopOnExit,
		Listeners: l.listeners(), OnStart: func(p *Process) { go l.logReady(ctx, p) }}, nil
}

// listeners are the addresses the node's Envoy listens on.
func (l Launcher) listeners() []Listener {
	n := l.Bootstrap.Node
	var out []Listener
	add := func(what, host string, port uint32) {
		if port != 0 {
			out = append(out, Listener{What: what, Addr: net.JoinHostPort(host, strconv.Itoa(int(port)))})
		}
	}
	add("the node's public listener", n.PublicAddress, n.PublicPort)
	add("the node's mesh listener", n.MeshAddress, n.MeshPort)
	add("the node's inbound listener", n.InboundAddress, n.InboundPort)
	return out
}

func (l Launcher) logReady(ctx context.Context, p *Process) {
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.WaitReady(readyCtx); err != nil {
		if ctx.Err() == nil {
			l.Logger.Error("envoy not ready", "pid", p.Pid(), "err", err)
		}
		return
	}
	l.Logger.Info("envoy ready", "pid", p.Pid(), "node", l.Bootstrap.Node.ID, "admin", l.AdminSocket())
}

// StartReady prepares the node, starts its Envoy and waits until it is
// ready (for tests and benchmarks, which need no supervisor).
func (l Launcher) StartReady(ctx context.Context) (*Process, error) {
	cfg, err := l.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	p, err := Start(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.WaitReady(ctx); err != nil {
		_ = p.child.Kill()
		return nil, err
	}
	return p, nil
}

// baseIDFile, in the work folder, holds the base id the node's epoch-0
// Envoy picked (--base-id-path), which its hot restarts and shared memory
// region are named by.
const baseIDFile = "envoy-base-id"
