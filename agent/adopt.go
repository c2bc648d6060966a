package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// An agent that stops or crashes leaves its replicas running (they are
// detached: proc.Spec.Detached), and its next incarnation adopts them: it
// finds each from the record it wrote when it started the replica's
// process, checks that the pid still names that very process (its start
// time) and that the process carries the replica's environment (node,
// agent mark, tag), then re-attaches its health probe, its log rotation
// and its registration, and watches it through a pidfd. A replica the
// desired state no longer wants, or wants with another spec, is then
// stopped or replaced as usual by reconcile.

// runningDir is the folder, in the agent's work folder, of the records
// of the replica processes it runs.
const runningDir = "running"

// replicaRecord is what an agent writes down of a replica process it
// runs, for the next agent to adopt it. Later agents may add fields;
// every agent reads the ones it knows (JSON, unknown fields ignored), so
// an upgraded or downgraded agent still adopts.
type replicaRecord struct {
	Tag     string        `json:"tag"`
	Backend string        `json:"backend"`
	Process proc.Identity `json:"process"`
	// Host and Port are where it listens.
	Host string `json:"host"`
	Port int    `json:"port"`
	// Spec is the meshspec.SpecHash of the process spec it runs.
	Spec string `json:"spec"`
	// ProcessSpec is what it runs, to restart it with while the desired
	// state cannot be read; the record is the agent's user's alone.
	ProcessSpec meshspec.ProcessSpec `json:"process_spec"`
	// UID is the user it runs as.
	UID int `json:"uid"`
	// GRPC: probed with the gRPC health service.
	GRPC bool `json:"grpc,omitempty"`
	// Config is the user_config version it took (meshspec.UserConfig.Version),
	// "" for none yet.
	Config string `json:"config,omitempty"`
	// Devices are its devices of each resource, by index.
	Devices map[string][]int `json:"devices,omitempty"`
	// Restarts is how many times its process was restarted in a row.
	Restarts int `json:"restarts,omitempty"`
	// ReconfigureToken is the secret it takes user_config with
	// (wire.ReconfigureTokenEnv); empty in a previous release's record.
	ReconfigureToken string `json:"reconfigure_token,omitempty"`
}

// recordPath is where the record of the replica with service id sid is.
func recordPath(workDir, sid string) string {
	return filepath.Join(workDir, runningDir, sid+".json")
}

// writeRecord writes rec atomically (envoy.ReplaceFile): a crash leaves the
// old record or the new one, never half of one.
func writeRecord(workDir, sid string, rec replicaRecord) error {
	dir := filepath.Join(workDir, runningDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("replica record: %w", err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("replica record: %w", err)
	}
	if err := envoy.ReplaceFile(recordPath(workDir, sid), b); err != nil {
		return fmt.Errorf("replica record: %w", err)
	}
	return nil
}

func removeRecord(workDir, sid string) error {
	if err := os.Remove(recordPath(workDir, sid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replica record: %w", err)
	}
	return nil
}

// adoptable reads the records in workDir and returns, by tag, those whose
// process still runs as the replica of this node's agent the record says;
// it removes the others (a replica that exited while no agent watched it
// is started afresh). What it cannot read it leaves, logging nothing:
// the caller logs what it adopts.
func adoptable(node, workDir string) (map[string]replicaRecord, []string) {
	out := map[string]replicaRecord{}
	var dropped []string
	files, _ := filepath.Glob(filepath.Join(workDir, runningDir, "*.json"))
	for _, f := range files {
		var rec replicaRecord
		b, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.Tag == "" || !rec.Process.Alive() || !processOfReplica(rec.Process.Pid, node, workDir, rec.Tag) {
			_ = os.Remove(f)
			dropped = append(dropped, strings.TrimSuffix(filepath.Base(f), ".json"))
			continue
		}
		out[rec.Tag] = rec
	}
	return out, dropped
}

// processOfReplica reports whether process pid carries the environment of
// replica tag of the agent of node working in dir.
func processOfReplica(pid int, node, dir, tag string) bool {
	environ, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "environ"))
	if err != nil {
		return false
	}
	got, ok := replicaTagOf(environ, node, dir)
	return ok && got == tag
}

// adopt takes over the replica rec records, started by a previous agent:
// it claims its devices, watches its process, probes it once and
// registers it with what the probe says (so a serving replica stays
// passing across the restart), then runs it as if it had started it.
func (a *Agent) adopt(ctx context.Context, rec replicaRecord) (*replica, error) {
	uid, err := a.replicaUID(rec.Backend)
	if err != nil {
		return nil, err
	}
	switch {
	case rec.Host != a.listenHost:
		return nil, fmt.Errorf("it listens on %s, and this agent's replicas listen on %s", rec.Host, a.listenHost)
	case rec.UID != uid && (rec.UID == 0 || rec.UID == os.Geteuid()) && uid != os.Geteuid():
		return nil, fmt.Errorf("it runs as user %d, privileged, and this agent's replicas run as %d", rec.UID, uid)
	case rec.UID != uid:
		// Another user than this agent gives the backend (an agent of
		// another release or with other flags started it, as nobody, say):
		// it serves on as that user, and its next start is as this
		// agent's, so an upgrade restarts no replica.
		a.log.Info("adopting a replica that runs as another user than this agent gives its backend; it keeps that user until it restarts",
			"replica", rec.Tag, "uid", rec.UID, "backend_uid", uid)
	}
	if err := a.devices.claim(rec.Tag, rec.Devices); err != nil {
		return nil, err
	}
	child, err := proc.Adopt(rec.Process)
	if err != nil {
		a.devices.release(rec.Tag)
		return nil, err
	}
	if a.secrets != nil {
		if err := a.secrets.AddBackend(ctx, rec.Backend); err != nil {
			a.log.Warn("an adopted replica's identity is not followed; the node serves it with the one on disk", "replica", rec.Tag, "err", err)
		}
	}
	r := a.newReplica(rec.Backend, rec.Tag, rec.ProcessSpec, rec.GRPC, rec.Port)
	r.adopted, r.specHash, r.devices, r.uid = true, rec.Spec, rec.Devices, rec.UID
	r.reconfigureToken = rec.ReconfigureToken
	r.process.Store(&rec.Process)
	r.restarts.Store(int64(rec.Restarts))
	if rec.Config != "" {
		a.state.configs.Store(rec.Tag, rec.Config)
	}
	status := api.HealthPassing
	if err := r.check(ctx); err != nil {
		status = api.HealthCritical
	}
	if err := r.register("", rec.Restarts, status); err != nil {
		a.log.Warn("could not register an adopted replica; its probe will", "replica", rec.Tag, "err", err)
	}
	r.watch(child)
	if status == api.HealthPassing {
		// Ready for the picker now, as its registration says, not at its
		// next probe: a node's picker that knows no ready replica leaves
		// the pick to Envoy, prompts and sessions unknown to it.
		a.picker.SetReady(r.tag, true)
	}
	r.log.Info("replica adopted", "backend", rec.Backend, "pid", rec.Process.Pid, "address", r.address(), "status", status)
	return r, nil
}

// runsFor reports whether an adopted replica runs what placement p of
// backend b wants: the spec the placement was made for, or the backend's
// current one.
func (r *replica) runsFor(b meshspec.Backend, p meshspec.Placement) bool {
	return p.Runs(r.specHash) || r.specHash == meshspec.SpecHash(b.Process)
}

// StopLeft stops the replicas an agent of node left running in workDir,
// for a node that is being removed (servemesh agent --stop-all): each gets
// SIGTERM and, after grace, SIGKILL (at once with grace 0), with whatever
// it started; their records go, and their registrations and the node's
// in the local Consul agent (consul nil: none). It takes the work folder's
// lock, so it refuses while an agent works there. It returns the pids it
// stopped.
func StopLeft(ctx context.Context, consul *api.Client, node, workDir string, grace time.Duration) ([]int, error) {
	workDir, err := filepath.Abs(workDir)
	if err != nil {
		return nil, fmt.Errorf("agent work dir: %w", err)
	}
	unlock, err := LockWorkDir(workDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	records, _ := adoptable(node, workDir)
	var stopped []int
	var wg sync.WaitGroup
	for _, rec := range records {
		if p, err := proc.Adopt(rec.Process); err == nil {
			stopped = append(stopped, rec.Process.Pid)
			wg.Go(func() {
				if grace == 0 {
					_ = p.Kill()
				} else {
					_ = p.Stop(grace)
				}
			})
		}
	}
	wg.Wait()
	stopped = append(stopped, killLeftovers(node, workDir, nil)...)
	for tag := range records {
		sid := wire.ReplicaServiceID(tag)
		_ = removeRecord(workDir, sid)
		if consul != nil {
			_ = consul.Agent().ServiceDeregisterOpts(sid, (&api.QueryOptions{}).WithContext(ctx))
		}
	}
	if consul != nil {
		_ = consul.Agent().ServiceDeregisterOpts(wire.AgentServiceID(node), (&api.QueryOptions{}).WithContext(ctx))
	}
	return stopped, nil
}
