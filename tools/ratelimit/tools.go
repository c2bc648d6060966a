//go:build tools

// Package tools pins the rate limit service that backs servemesh's global
// rate limits: Envoy's reference implementation (envoyproxy/ratelimit,
// Apache-2.0), with Redis as its store. Its main branch is the release
// line (it publishes no tags), so the pin is a commit's pseudo-version.
package tools

import _ "github.com/envoyproxy/ratelimit/src/service_cmd"
