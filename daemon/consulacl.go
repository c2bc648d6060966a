package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/backoff"
)

// ErrConsulOpen says Consul lets a request without a token write: its ACLs
// are off or default to allow.
var ErrConsulOpen = errors.New("the Consul agent accepts writes without a token (ACLs off, or default allow): any process that reaches it, a replica included, could mint any identity from its CA and rewrite the desired state; turn ACLs on with default deny (deploy/consul/README.md), or pass --insecure-consul on a single trusted host")

// aclProbePrefix is where the probe writes: outside any servemesh state.
const aclProbePrefix = "servemesh-acl-probe/"

// checkConsulACLs returns nil once Consul refuses a write without a token,
// ErrConsulOpen if it accepts one, or ctx's error; while Consul does not
// answer it retries, logging why. With insecure it only warns.
func checkConsulACLs(ctx context.Context, log *slog.Logger, insecure bool) error {
	if insecure {
		log.Warn("INSECURE: not checking that Consul enforces ACLs (--insecure-consul); without them any process that reaches Consul can mint identities and rewrite the state")
		return nil
	}
	cfg := consulapi.DefaultConfig()
	cfg.Token, cfg.TokenFile = "", "" // anonymous: what a replica without a token gets
	anon, err := consulapi.NewClient(cfg)
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	var open bool
	err = backoff.Retry(ctx, backoff.Consul(), func(ctx context.Context) (err error) {
		open, err = anonymousWrites(ctx, anon)
		return err
	}, func(err error, pause time.Duration) {
		log.Warn("checking that Consul enforces ACLs failed; retrying (is Consul up?)", "err", err, "retry_in", pause)
	})
	switch {
	case err != nil:
		return ctx.Err()
	case open:
		return ErrConsulOpen
	}
	log.Info("Consul refuses writes without a token: ACLs are enforced")
	return nil
}

// anonymousWrites tries to write a probe key without a token: it reports
// whether Consul accepted (the key is then removed), or an error when
// Consul gave no answer either way.
func anonymousWrites(ctx context.Context, anon *consulapi.Client) (bool, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	key := aclProbePrefix + hex.EncodeToString(b[:])
	_, err := anon.KV().Put(&consulapi.KVPair{Key: key, Value: []byte("probe")}, (&consulapi.WriteOptions{}).WithContext(ctx))
	var status consulapi.StatusError
	switch {
	case err == nil:
		_, _ = anon.KV().Delete(key, (&consulapi.WriteOptions{}).WithContext(ctx))
		return true, nil
	case errors.As(err, &status) && status.Code == 403:
		return false, nil
	}
	return false, fmt.Errorf("probe write: %w", err)
}
