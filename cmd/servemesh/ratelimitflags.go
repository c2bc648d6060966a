package main

import (
	"errors"

	"github.com/spf13/pflag"

	"github.com/servemesh/servemesh/meshspec"
)

// rateLimitFlags are `endpoint create`'s rate limit flags: a local limit
// (--rate-limit), a global one (--global-rate-limit) and a token quota
// (--token-quota), each or any.
type rateLimitFlags struct {
	local, burst                 int
	header                       string
	global                       int
	unit, globalHeader, failMode string
	clientAddress                bool
	tokens                       int
	tokensUnit, tokensHeader     string
	tokensFailMode               string
}

func (r *rateLimitFlags) add(fs *pflag.FlagSet) {
	fs.IntVar(&r.local, "rate-limit", 0, "the requests a second each node lets through (a token bucket per node; over it: 429 with Retry-After) (default: no limit)")
	fs.IntVar(&r.burst, "rate-limit-burst", 0, "the requests a node's bucket saves for a burst (default: --rate-limit)")
	fs.StringVar(&r.header, "rate-limit-header", "", "a request header, such as x-tenant-id, each value of which has its own bucket (default: one bucket)")
	fs.IntVar(&r.global, "global-rate-limit", 0, "the requests every node together lets through each --global-rate-limit-unit (counted by the nodes' rate limit services in a shared Redis; over it: 429 with Retry-After) (default: no limit)")
	fs.StringVar(&r.unit, "global-rate-limit-unit", "", "the global limit's window: second (the default), minute, hour or day")
	fs.StringVar(&r.globalHeader, "global-rate-limit-header", "", "a request header, such as x-api-key, each value of which has its own global count (default: one count)")
	fs.BoolVar(&r.clientAddress, "global-rate-limit-client-address", false, "give each client address its own global count")
	fs.StringVar(&r.failMode, "global-rate-limit-failure-mode", "", "while a node cannot check the global limit: open (let requests through, the default) or closed (refuse them with 503)")
	fs.IntVar(&r.tokens, "token-quota", 0, "the model tokens (answers' usage.total_tokens) every node together lets through each --token-quota-unit; a request once they are spent: 429 (default: no quota)")
	fs.StringVar(&r.tokensUnit, "token-quota-unit", "", "the token quota's window: minute (the default), second, hour or day")
	fs.StringVar(&r.tokensHeader, "token-quota-header", "", "a request header, such as x-tenant-id, each value of which has its own token quota (default: one quota)")
	fs.StringVar(&r.tokensFailMode, "token-quota-failure-mode", "", "while a node cannot check the token quota: open (the default) or closed")
}

// limit is the endpoint's rate limit the flags give, nil for none.
func (r *rateLimitFlags) limit() (*meshspec.RateLimit, error) {
	var out meshspec.RateLimit
	switch {
	case r.local > 0:
		out.Local = &meshspec.LocalRateLimit{RequestsPerSecond: r.local, Burst: r.burst, Header: r.header}
	case r.burst != 0 || r.header != "":
		return nil, errors.New("--rate-limit-burst and --rate-limit-header shape a rate limit: give --rate-limit N too")
	}
	switch {
	case r.global > 0:
		out.Global = &meshspec.GlobalRateLimit{Requests: r.global, Unit: r.unit, Header: r.globalHeader, ClientAddress: r.clientAddress, FailureMode: r.failMode}
	case r.unit != "" || r.globalHeader != "" || r.clientAddress || r.failMode != "":
		return nil, errors.New("--global-rate-limit-unit, -header, -client-address and -failure-mode shape a global rate limit: give --global-rate-limit N too")
	}
	switch {
	case r.tokens > 0:
		out.Tokens = &meshspec.TokenQuota{Tokens: r.tokens, Unit: r.tokensUnit, Header: r.tokensHeader, FailureMode: r.tokensFailMode}
	case r.tokensUnit != "" || r.tokensHeader != "" || r.tokensFailMode != "":
		return nil, errors.New("--token-quota-unit, -header and -failure-mode shape a token quota: give --token-quota N too")
	}
	if out.Local == nil && out.Global == nil && out.Tokens == nil {
		return nil, nil
	}
	return &out, nil
}
