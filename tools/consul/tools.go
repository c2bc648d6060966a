//go:build tools

// Package tools pins the Consul agent that servemesh's tests and demo run.
// Consul v1.14.8 is the last MPL-2.0 release line used here; do not upgrade.
package tools

import _ "github.com/hashicorp/consul"
