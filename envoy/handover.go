package envoy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
)

// A node's Envoy outlives its supervisor (Config.HotRestart): the agent
// that supervises it may stop, crash or be upgraded while the Envoy
// serves on. The supervisor writes down the Envoy it runs (envoyRecord,
// in the state file); the next supervisor finds it there and
//
//  1. adopts it, if it still runs (the same pid and start time, started
//     with this node's bootstrap) and runs what the new supervisor would
//     start: the same binary, bootstrap and settings;
//  2. hot restarts it otherwise (Envoy's --restart-epoch): the new Envoy
//     takes the old one's listening sockets, the old one drains its
//     connections for the drain time and exits, and no connection is
//     refused or cut short of the drain; if the new one fails before it
//     is ready, the old one serves on and the failure is logged;
//  3. stops it (drained) and starts afresh when the two binaries speak
//     different hot restart protocols (--hot-restart-version).
//
// Without a record, or when the recorded Envoy is gone, it starts one at
// epoch 0.

// envoyRecord is what a supervisor writes down of the Envoy it runs. Later
// versions may add fields; every version reads those it knows.
type envoyRecord struct {
	Process proc.Identity `json:"process"`
	Epoch   int           `json:"epoch"`
	// Binary is the binary's path; BinaryID its size and modification
	// time, which a package upgrade in place changes.
	Binary   string `json:"binary"`
	BinaryID string `json:"binary_id"`
	// HotRestartVersion is the binary's --hot-restart-version.
	HotRestartVersion string `json:"hot_restart_version"`
	// Bootstrap is the SHA-256 of the bootstrap it started with.
	Bootstrap string `json:"bootstrap"`
	// Settings are its arguments that every epoch shares (Config.settings).
	Settings []string `json:"settings"`
	// SocketPath is its hot restart sockets' path (Config.SocketPath),
	// which its successor must share to take over; empty for an Envoy an
	// earlier release started, with Envoy's abstract sockets, which keep
	// serving every later epoch until the Envoy is next started afresh.
	SocketPath string `json:"socket_path,omitempty"`
	// Draining are the earlier epochs it took over from, which drain and
	// then are ended by it; a supervisor that stops before that ends them
	// leaves them to the next one (endParent) or to StopLeft.
	Draining []proc.Identity `json:"draining,omitempty"`
	// ParentShutdownS is its --parent-shutdown-time-s: how long after it
	// started it ends the Envoys in Draining. 0 in an earlier release's
	// record, which ended them 5 s after their drain.
	ParentShutdownS int `json:"parent_shutdown_s,omitempty"`
	// StartedAt is when it started; zero in an earlier release's record.
	StartedAt time.Time `json:"started_at,omitzero"`
}

// parentShutdown is how long after the recorded Envoy started it ends
// those it replaced.
func (r envoyRecord) parentShutdown(c Config) time.Duration {
	if r.ParentShutdownS > 0 {
		return time.Duration(r.ParentShutdownS) * time.Second
	}
	return c.drainTime() + defaultUpgradeGrace
}

// drainingUntil is when the recorded Envoy ends those it replaced; zero
// if unknown (an earlier release's record).
func (r envoyRecord) drainingUntil(c Config) time.Time {
	if r.StartedAt.IsZero() {
		return time.Time{}
	}
	return r.StartedAt.Add(r.parentShutdown(c))
}

// running is what the supervisor would start now, as a record.
func (s *Supervisor) running(ctx context.Context) (envoyRecord, error) {
	c := s.Config
	binary, err := filepath.EvalSymlinks(c.Binary)
	if err != nil {
		return envoyRecord{}, fmt.Errorf("envoy binary: %w", err)
	}
	info, err := os.Stat(binary)
	if err != nil {
		return envoyRecord{}, fmt.Errorf("envoy binary: %w", err)
	}
	bootstrap, err := os.ReadFile(c.ConfigPath)
	if err != nil {
		return envoyRecord{}, fmt.Errorf("envoy bootstrap: %w", err)
	}
	sum := sha256.Sum256(bootstrap)
	out, err := exec.CommandContext(ctx, c.Binary, "--hot-restart-version").CombinedOutput()
	if err != nil {
		return envoyRecord{}, fmt.Errorf("%s --hot-restart-version: %w", c.Binary, err)
	}
	return envoyRecord{Binary: binary, BinaryID: strconv.FormatInt(info.Size(), 10) + "@" + info.ModTime().UTC().Format(time.RFC3339Nano),
		HotRestartVersion: strings.TrimSpace(string(out)), Bootstrap: hex.EncodeToString(sum[:]), Settings: c.settings()}, nil
}

// same reports whether the Envoy r records runs what want would.
func (r envoyRecord) same(want envoyRecord) bool {
	return r.Binary == want.Binary && r.BinaryID == want.BinaryID && r.Bootstrap == want.Bootstrap && slices.Equal(r.Settings, want.Settings)
}

// changes names what differs between the Envoy r records and want.
func (r envoyRecord) changes(want envoyRecord) string {
	var what []string
	if r.Binary != want.Binary || r.BinaryID != want.BinaryID {
		what = append(what, "binary")
	}
	if r.Bootstrap != want.Bootstrap {
		what = append(what, "bootstrap")
	}
	if !slices.Equal(r.Settings, want.Settings) {
		what = append(what, "settings")
	}
	return strings.Join(what, ", ")
}

func readRecord(path string) (envoyRecord, bool) {
	var r envoyRecord
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &r) != nil || r.Process.Pid == 0 {
		return envoyRecord{}, false
	}
	return r, true
}

func writeRecord(path string, r envoyRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("envoy record: %w", err)
	}
	if err := ReplaceFile(path, b); err != nil {
		return fmt.Errorf("envoy record: %w", err)
	}
	return nil
}

// startedWith reports whether process pid was started with bootstrap
// path (-c path on its command line).
func startedWith(pid int, path string) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && bytes.Contains(cmdline, []byte("\x00-c\x00"+path+"\x00"))
}

// startedWithIn lists the process group leaders started with bootstrap
// path: a node's Envoys (their parents), every epoch.
func startedWithIn(path string) []proc.Identity {
	var out []proc.Identity
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !startedWith(pid, path) {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
			if id, err := proc.IdentityOf(pid); err == nil {
				out = append(out, id)
			}
		}
	}
	return out
}

// first adopts, hot restarts or starts the node's Envoy (see above).
func (s *Supervisor) first(ctx context.Context) (*Process, error) {
	want, err := s.running(ctx)
	if err != nil {
		return nil, err
	}
	s.want = want
	rec, ok := readRecord(s.StateFile)
	if !ok {
		return s.startFresh(ctx)
	}
	for _, d := range rec.Draining { // handed over by a supervisor that stopped before they ended
		if p, err := proc.Adopt(d); err == nil {
			go s.endParent(&Process{cfg: s.Config, child: p}, rec.parentShutdown(s.Config))
		}
	}
	if !startedWith(rec.Process.Pid, s.Config.ConfigPath) {
		s.Config.Logger.Info("the envoy a previous agent started has exited; starting one", "pid", rec.Process.Pid)
		return s.startFresh(ctx)
	}
	child, err := proc.Adopt(rec.Process)
	if err != nil {
		s.Config.Logger.Info("the envoy a previous agent started is gone; starting one", "err", err)
		return s.startFresh(ctx)
	}
	old := &Process{cfg: s.Config, child: child, admin: Admin{Socket: s.Config.AdminSocket}}
	log := s.Config.Logger.With("pid", rec.Process.Pid, "epoch", rec.Epoch)
	if rec.same(want) {
		log.Info("envoy adopted: it runs this node's binary, bootstrap and settings")
		return old, nil
	}
	if rec.HotRestartVersion != want.HotRestartVersion {
		log.Warn("envoy restarted, not hot restarted: the new binary speaks another hot restart protocol; connections are drained",
			"changed", rec.changes(want), "running", rec.HotRestartVersion, "new", want.HotRestartVersion)
		_ = old.Stop(ctx, s.Drain)
		return s.start(0, 0, s.Config.SocketPath)
	}
	baseID, err := readBaseID(s.Config.BaseIDPath)
	if err != nil {
		log.Error("envoy not hot restarted: its base id is unknown; the running one serves on", "changed", rec.changes(want), "err", err)
		return old, nil
	}
	if s.earlierEpochServes(ctx, old, rec) {
		log.Info("envoy hot restart deferred: the envoy it replaced last still serves requests it had open, which a hot restart now would cut; "+
			"it goes ahead once they end", "changed", rec.changes(want), "draining_until", rec.drainingUntil(s.Config))
		s.deferred = &deferredRestart{rec: rec, baseID: baseID}
		return old, nil
	}
	return s.hotRestart(ctx, rec, baseID, old), nil
}

// A hot restart (epoch n+1) makes the running Envoy (epoch n) end the one
// it replaced (n-1) at once, cutting what n-1 still serves. So while n-1
// serves a connection, the supervisor keeps epoch n and hot restarts it
// once n-1 has none left or has exited (Run retries a deferredRestart).
type deferredRestart struct {
	rec    envoyRecord // the running Envoy's
	baseID int
}

// earlierEpochServes reports whether an Envoy the running one (old,
// recorded as rec) replaced still runs and serves a connection, as old
// counts them (server.parent_connections); unknown counts as serving.
func (s *Supervisor) earlierEpochServes(ctx context.Context, old *Process, rec envoyRecord) bool {
	if len(alive(rec.Draining)) == 0 {
		return false
	}
	n, err := old.admin.ParentConnections(ctx)
	return err != nil || n > 0
}

// hotRestart starts the next epoch of old (recorded as rec), which takes
// over its listeners; old drains, serves what it has open for the upgrade
// grace and is ended by its successor. If the next epoch fails, old
// serves on and is returned.
func (s *Supervisor) hotRestart(ctx context.Context, rec envoyRecord, baseID int, old *Process) *Process {
	log := s.Config.Logger.With("pid", rec.Process.Pid, "epoch", rec.Epoch)
	log.Info("envoy hot restarting", "changed", rec.changes(s.want), "old_serves_open_requests_for", s.Config.parentShutdown())
	if rec.SocketPath == "" && s.Config.SocketPath != "" {
		log.Warn("the running envoy's hot restart sockets are in the abstract namespace, which any local user reaches (an earlier release started it); " +
			"they stay so until the envoy is next started afresh (servemesh agent --stop-all, then start the agent)")
	}
	next, err := s.start(rec.Epoch+1, baseID, rec.SocketPath, append([]proc.Identity{rec.Process}, alive(rec.Draining)...)...)
	if err == nil {
		err = next.waitEpoch(ctx, rec.Epoch+1)
	}
	if err != nil {
		if next != nil {
			_ = next.child.Kill()
		}
		log.Error("the new envoy could not take over; the running one serves on", "err", err)
		if err := writeRecord(s.StateFile, rec); err != nil { // the old one's again
			log.Warn("the next agent will not adopt this envoy", "err", err)
		}
		return old
	}
	go s.endParent(old, s.Config.parentShutdown())
	return next
}

// alive are those of ids that still run.
func alive(ids []proc.Identity) []proc.Identity {
	var out []proc.Identity
	for _, id := range ids {
		if id.Alive() {
			out = append(out, id)
		}
	}
	return out
}

// endParent makes sure a hot-restarted Envoy exits: its successor ends
// it parentShutdown after it started; this kills it if it outlives that
// (killed before, it would take its successor down: Envoy aborts when its
// parent is gone before it ended it).
func (s *Supervisor) endParent(old *Process, parentShutdown time.Duration) {
	limit := parentShutdown + 10*time.Second
	select {
	case <-old.Done():
	case <-time.After(limit):
		s.Config.Logger.Warn("the hot-restarted envoy outlived its drain; killing it", "pid", old.Pid())
		_ = old.child.Kill()
	}
}

// start starts Envoy at epoch (taking over from base id's, above 0) with
// its hot restart sockets at socketPath (the running one's, above 0) and
// records it, with the earlier epochs still draining.
func (s *Supervisor) start(epoch, baseID int, socketPath string, draining ...proc.Identity) (*Process, error) {
	cfg := s.Config
	cfg.Epoch, cfg.BaseID, cfg.SocketPath = epoch, baseID, socketPath
	if epoch == 0 && cfg.BaseIDPath != "" {
		removeSharedMemory(cfg.BaseIDPath) // of the last Envoy here, which no longer runs
		_ = os.Remove(cfg.BaseIDPath)      // the new Envoy writes the one it picks
	}
	p, err := Start(cfg)
	if err != nil {
		return nil, err
	}
	p.cfg = cfg
	if s.StateFile != "" {
		rec := s.want
		rec.Process, rec.Epoch, rec.SocketPath, rec.Draining = p.child.Identity(), epoch, socketPath, draining
		rec.ParentShutdownS, rec.StartedAt = int(cfg.parentShutdown().Seconds()), time.Now().UTC()
		if err := writeRecord(s.StateFile, rec); err != nil {
			s.Config.Logger.Warn("the next agent will not adopt this envoy", "err", err)
		}
	}
	return p, nil
}

// SharedMemoryDir is where Envoy's hot restart keeps each base id's
// shared memory region (POSIX shared memory).
const SharedMemoryDir = "/dev/shm"

// removeSharedMemory removes the shared memory region of the Envoy whose
// base id is in baseIDPath, once no Envoy of that base id runs. Envoy
// leaves it when it exits, and each fresh start picks a new base id, so
// a node's restarts would otherwise fill /dev/shm (issue 58, a low).
func removeSharedMemory(baseIDPath string) {
	id, err := readBaseID(baseIDPath)
	if err != nil {
		return
	}
	// Envoy names it after ten times the base id (the base ids of a hot
	// restart's sockets are the base id times ten plus the epoch).
	_ = os.Remove(filepath.Join(SharedMemoryDir, fmt.Sprintf("envoy_shared_memory_%d", id*10)))
}

// readBaseID reads the base id an epoch-0 Envoy wrote (--base-id-path).
func readBaseID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("base id: %w", err)
	}
	id, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("base id %q in %s: %w", b, path, err)
	}
	return id, nil
}

// waitEpoch waits until this Envoy, hot restarted at epoch, serves: its
// admin API (the same socket as its parent's, which the parent gives up)
// says it is LIVE at that epoch. It fails early if the Envoy exits.
func (p *Process) waitEpoch(ctx context.Context, epoch int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return p.waitUntil(ctx, fmt.Sprintf("live at epoch %d", epoch), func(probe context.Context) bool {
		info, err := p.admin.ServerInfo(probe)
		return err == nil && info.State == "LIVE" && info.Epoch == epoch
	})
}

// ServerInfo is what servemesh reads of Envoy's /server_info.
type ServerInfo struct {
	State string
	Epoch int
}

// ServerInfo reads /server_info: the server's state and restart epoch.
func (a Admin) ServerInfo(ctx context.Context) (ServerInfo, error) {
	body, err := a.Get(ctx, "/server_info")
	if err != nil {
		return ServerInfo{}, err
	}
	var raw struct {
		State   string `json:"state"`
		Options struct {
			RestartEpoch json.Number `json:"restart_epoch"`
		} `json:"command_line_options"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return ServerInfo{}, fmt.Errorf("envoy admin /server_info: %w", err)
	}
	epoch, _ := strconv.Atoi(raw.Options.RestartEpoch.String())
	if raw.State == "" {
		return ServerInfo{}, errors.New("envoy admin /server_info: no state")
	}
	return ServerInfo{State: raw.State, Epoch: epoch}, nil
}

// StopLeft stops the Envoy a supervisor left serving in the node's work
// folder (see StateFile), for a node that is being removed: it drains its
// listeners for drain, then stops it; with drain 0 it kills it at once.
// It returns the pid it stopped, 0 if none ran.
func (l Launcher) StopLeft(ctx context.Context, drain time.Duration, log *slog.Logger) (int, error) {
	workDir, err := filepath.Abs(l.WorkDir)
	if err != nil {
		return 0, fmt.Errorf("envoy work dir: %w", err)
	}
	state := filepath.Join(workDir, StateFile)
	rec, ok := readRecord(state)
	if !ok {
		return 0, nil
	}
	defer func() { _ = os.Remove(state) }()
	bootstrap := filepath.Join(workDir, "bootstrap.yaml")
	// Earlier epochs still draining (recorded or not: an older release
	// records none) would serve on alone.
	for _, id := range append(rec.Draining, startedWithIn(bootstrap)...) {
		if id.Pid == rec.Process.Pid {
			continue
		}
		if p, err := proc.Adopt(id); err == nil {
			_ = p.Kill()
		}
	}
	if !startedWith(rec.Process.Pid, bootstrap) {
		return 0, nil
	}
	child, err := proc.Adopt(rec.Process)
	if err != nil {
		return 0, nil //nolint:nilerr // it exited already
	}
	p := &Process{cfg: Config{Logger: log, StopGrace: 5 * time.Second}, child: child, admin: Admin{Socket: l.AdminSocket()}}
	defer removeSharedMemory(filepath.Join(workDir, baseIDFile))
	if drain == 0 {
		_ = child.Kill()
		return rec.Process.Pid, nil
	}
	return rec.Process.Pid, p.Stop(ctx, drain)
}
