package testutil

import (
	"testing"
	"time"

	"github.com/servemesh/servemesh/internal/devconsul"
)

// Consul is a real Consul dev agent (see package devconsul).
type Consul = devconsul.Agent

// StartConsul starts a dev agent on free loopback ports, logging into dir.
// It fails rather than skips when Consul is missing.
func StartConsul(dir string) (*Consul, error) { return devconsul.Start(dir, 0) }

// MustStartConsul starts a dev agent for one test, logging into a folder of
// the test's, and stops it when the test ends. The test fails, never skips,
// when Consul is missing.
func MustStartConsul(t testing.TB) *Consul {
	t.Helper()
	c, err := devconsul.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatalf("the real Consul is required (`make tools` installs it): %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartConsulLater starts a dev agent for one test after delay, on the
// HTTP address it returns at once (for daemons started before Consul), and
// stops it when the test ends. A missing Consul fails the test at once,
// not after whatever the test waits for.
func StartConsulLater(t testing.TB, delay time.Duration) string {
	t.Helper()
	if _, err := devconsul.Find(); err != nil {
		t.Fatalf("the real Consul is required (`make tools` installs it): %v", err)
	}
	addr := MustFreeAddr("127.0.0.1")
	later := make(chan *Consul, 1)
	dir := t.TempDir()
	go func() {
		time.Sleep(delay)
		c, err := devconsul.StartWith(dir, devconsul.Options{HTTPPort: int(Port(addr))})
		if err != nil {
			t.Errorf("the real Consul is required (`make tools` installs it): %v", err)
		}
		later <- c
	}()
	t.Cleanup(func() {
		if c := <-later; c != nil {
			c.Stop()
		}
	})
	return addr
}
