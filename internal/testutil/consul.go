package testutil

import "github.com/servemesh/servemesh/internal/devconsul"

// Consul is a real Consul dev agent (see package devconsul).
type Consul = devconsul.Agent

// StartConsul starts a dev agent on free loopback ports, logging into dir.
// It fails rather than skips when Consul is missing.
func StartConsul(dir string) (*Consul, error) { return devconsul.Start(dir, 0) }
