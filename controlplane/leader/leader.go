package leader

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/consulwatch"
	"github.com/servemesh/servemesh/internal/heartbeat"
	"github.com/servemesh/servemesh/wire"
)

// Info identifies a controller, and the servemesh release and protocol it
// runs (Protocol 0: a release that announced none).
type Info struct {
	ID       string `json:"id"`
	API      string `json:"api"`
	Version  string `json:"version,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
}

// Current reads who holds the lock at key: false if nobody does.
func Current(ctx context.Context, client *api.Client, key string) (Info, bool, error) {
	pair, _, err := client.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return Info{}, false, fmt.Errorf("leader: read %s: %w", key, err)
	}
	if pair == nil || pair.Session == "" {
		return Info{}, false, nil
	}
	var holder Info
	if err := json.Unmarshal(pair.Value, &holder); err != nil {
		return Info{}, false, fmt.Errorf("leader: %s holds %q: %w", key, pair.Value, err)
	}
	return holder, true, nil
}

// Elector campaigns for the lock at Key.
type Elector struct {
	Client *api.Client
	Key    string
	Self   Info
	Logger *slog.Logger
	// CheckTTL is how long after its last heartbeat a controller counts as
	// dead; 3s when zero.
	CheckTTL time.Duration
	// LockDelay is how long a lock released by an invalidated session stays
	// unacquirable; 1s when zero.
	LockDelay time.Duration
}

// Run campaigns until ctx ends. lead is called each time this controller
// gains the lock; it must recover and return (an error gives the lock up for
// a while). follow is called whenever another controller is known to lead,
// and when this one loses the lock. No Consul error ends Run: whatever fails
// (registering the check, creating a session, acquiring) is retried with
// backoff, so leadership comes back once Consul answers again.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context) error, follow func(leader Info)) error {
	if e.CheckTTL == 0 {
		e.CheckTTL = 3 * time.Second
	}
	if e.LockDelay == 0 {
		e.LockDelay = time.Second
	}
	value, err := json.Marshal(e.Self)
	if err != nil {
		return fmt.Errorf("leader: encode info: %w", err)
	}
	retry := backoff.Consul()
	for ctx.Err() == nil {
		checkID, err := e.registerCheck()
		if err != nil {
			e.Logger.Warn("leader: registering the controller's check failed; retrying", "err", err)
			backoff.Sleep(ctx, retry.Next(0))
			continue
		}
		began := time.Now()
		e.campaign(ctx, checkID, value, lead, follow)
		_ = e.Client.Agent().ServiceDeregister(checkID)
		if ctx.Err() == nil {
			backoff.Sleep(ctx, retry.Next(time.Since(began)))
		}
	}
	return nil
}

// Service is the Consul service each controller registers; its TTL check
// is what the controller's sessions are bound to.
const Service = wire.ControllerService

// registerCheck registers this incarnation as an instance of Service with a
// TTL check; both have the returned id. The check belongs to the instance,
// not to the Consul node: a dead controller's check turns critical and
// takes down only its own instance (a node-level check would take down
// every service on the Consul node, replicas included), which Consul
// removes a minute later. A restarted controller with the same id first
// removes its predecessors' instances: that invalidates their sessions, so
// a lock a dead incarnation held is released at once instead of being kept
// alive by the new incarnation's heartbeats.
func (e *Elector) registerCheck() (string, error) {
	prefix := Service + "-" + e.Self.ID + "-"
	id := prefix + strconv.FormatInt(time.Now().UnixNano(), 36)
	agent := e.Client.Agent()
	services, err := agent.Services()
	if err != nil {
		return "", fmt.Errorf("leader: list services: %w", err)
	}
	for old := range services {
		if strings.HasPrefix(old, prefix) {
			e.Logger.Info("leader: removing a previous incarnation's check", "check", old)
			_ = agent.ServiceDeregister(old)
		}
	}
	if err := agent.ServiceRegister(&api.AgentServiceRegistration{
		ID: id, Name: Service, Meta: map[string]string{"controller": e.Self.ID},
		Check: &api.AgentServiceCheck{CheckID: id, Name: "servemesh controller " + e.Self.ID, TTL: e.CheckTTL.String(),
			Status: api.HealthPassing, DeregisterCriticalServiceAfter: "1m"},
	}); err != nil {
		return "", fmt.Errorf("leader: register check: %w", err)
	}
	return id, nil
}

// campaign heartbeats checkID and competes for the lock with sessions bound
// to it, until ctx ends or sessions keep failing (the check may be gone:
// Run registers it again).
func (e *Elector) campaign(ctx context.Context, checkID string, value []byte, lead func(ctx context.Context) error, follow func(leader Info)) {
	beatCtx, stopBeat := context.WithCancel(ctx)
	defer stopBeat()
	go heartbeat.Run(beatCtx, e.Client.Agent(), checkID, e.CheckTTL/3, heartbeat.Passing, e.Logger)
	kv := e.Client.KV()
	session := ""
	defer func() {
		if session != "" {
			_, _, _ = kv.Release(&api.KVPair{Key: e.Key, Session: session}, nil)
			_, _ = e.Client.Session().Destroy(session, nil)
		}
	}()
	failures := 0
	for ctx.Err() == nil && failures < 3 {
		if session == "" {
			var err error
			if session, err = e.newSession(checkID); err != nil {
				e.Logger.Warn("leader: create session", "err", err)
				failures++
				backoff.Sleep(ctx, time.Second)
				continue
			}
		}
		acquired, _, err := kv.Acquire(&api.KVPair{Key: e.Key, Value: value, Session: session}, (&api.WriteOptions{}).WithContext(ctx))
		switch {
		case err != nil && strings.Contains(err.Error(), "invalid session"):
			session = ""
			continue
		case err != nil:
			e.Logger.Warn("leader: acquire", "err", err)
			failures++
			backoff.Sleep(ctx, time.Second)
			continue
		case acquired:
			failures = 0
			e.Logger.Info("leader: acquired the lock", "key", e.Key, "id", e.Self.ID)
			if !e.holdLeadership(ctx, session, lead) {
				follow(Info{})
				_, _ = e.Client.Session().Destroy(session, nil)
				session = "" // start afresh
			}
			continue
		}
		failures = 0
		e.waitForRelease(ctx, follow)
	}
}

// newSession creates a session bound to the agent's serf health and
// the service check checkID, released on invalidation, with the lock delay.
func (e *Elector) newSession(checkID string) (string, error) {
	if err := e.Client.Agent().UpdateTTL(checkID, "", api.HealthPassing); err != nil {
		return "", fmt.Errorf("heartbeat before the session: %w", err)
	}
	id, _, err := e.Client.Session().Create(&api.SessionEntry{
		Name: "servemesh controller " + e.Self.ID, NodeChecks: []string{"serfHealth"}, ServiceChecks: []api.ServiceCheck{{ID: checkID}},
		LockDelay: e.LockDelay, Behavior: api.SessionBehaviorRelease,
	}, nil)
	return id, err
}

// holdLeadership runs lead, then blocks while this session holds the key. It
// returns true when ctx ended, false when leadership was lost or lead failed.
func (e *Elector) holdLeadership(ctx context.Context, session string, lead func(context.Context) error) bool {
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := lead(leadCtx); err != nil {
		e.Logger.Error("leader: could not take over; giving the lock up for a while", "err", err)
		_, _, _ = e.Client.KV().Release(&api.KVPair{Key: e.Key, Session: session}, nil)
		backoff.Sleep(ctx, 5*time.Second)
		return ctx.Err() != nil
	}
	// Loop ends with ctx's error, or nil once the lock is lost.
	return consulwatch.Loop(ctx, e.Logger, "the leader's lock", func(ctx context.Context, index uint64) (uint64, error) {
		pair, meta, err := e.Client.KV().Get(e.Key, (&api.QueryOptions{WaitIndex: index, WaitTime: time.Minute}).WithContext(ctx))
		if err != nil {
			return 0, err
		}
		if pair == nil || pair.Session != session {
			e.Logger.Warn("leader: lost the lock", "key", e.Key)
			return 0, consulwatch.ErrDone
		}
		return meta.LastIndex, nil
	}) != nil
}

// waitForRelease reports the current holder, then blocks until the key's
// holder changes.
func (e *Elector) waitForRelease(ctx context.Context, follow func(Info)) {
	first := true
	_ = consulwatch.Loop(ctx, e.Logger, "the leader's lock", func(ctx context.Context, index uint64) (uint64, error) {
		pair, meta, err := e.Client.KV().Get(e.Key, (&api.QueryOptions{WaitIndex: index, WaitTime: time.Minute}).WithContext(ctx))
		if err != nil {
			return 0, err
		}
		if pair == nil || pair.Session == "" {
			// Free (perhaps within its lock delay): try to acquire again.
			backoff.Sleep(ctx, 100*time.Millisecond)
			return 0, consulwatch.ErrDone
		}
		var holder Info
		if json.Unmarshal(pair.Value, &holder) == nil && first {
			follow(holder)
		}
		first = false
		return meta.LastIndex, nil
	})
}
