package testutil

import (
	"testing"

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
		t.Fatalf("the real Consul is required: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}
