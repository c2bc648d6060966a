package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/meshspec"
)

// TestStatusCountsRestarts: the backends' table sums their replicas'
// restarts.
func TestStatusCountsRestarts(t *testing.T) {
	var out bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	r := api.StatusReport{Backends: []api.BackendStatus{{Name: "flaky", Ready: 1, Running: 2, Desired: 2,
		Replicas: []api.ReplicaStatus{{Tag: "flaky#1", Restarts: 3}, {Tag: "flaky#2", Restarts: 1}}}}}
	if err := printStatus(cmd.OutOrStdout(), r); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "BACKEND") {
			row := strings.Fields(lines[i+1])
			if !strings.Contains(l, "RESTARTS") || row[0] != "flaky" || row[3] != "4" {
				t.Fatalf("status:\n%s", out.String())
			}
			return
		}
	}
	t.Fatalf("no backends table:\n%s", out.String())
}

// TestStatusListsRateLimits: an endpoint with a rate limit gets a row of
// each limit, its burst, key and failure mode; one without, none.
func TestStatusListsRateLimits(t *testing.T) {
	var out bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	r := api.StatusReport{Endpoints: []api.EndpointStatus{{Name: "open"}, {Name: "api",
		RateLimit: &meshspec.RateLimit{Local: &meshspec.LocalRateLimit{RequestsPerSecond: 5, Header: "x-tenant-id"},
			Global: &meshspec.GlobalRateLimit{Requests: 100, Unit: "minute", ClientAddress: true, FailureMode: meshspec.FailClosed},
			Tokens: &meshspec.TokenQuota{Tokens: 5000, Header: "x-tenant-id"}}}}}
	if err := printStatus(cmd.OutOrStdout(), r); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "RATE LIMIT") || !regexp.MustCompile(`(?m)^api\s+5/s\s+each node\s+5\s+value of x-tenant-id\s+-$`).MatchString(s) ||
		!regexp.MustCompile(`(?m)^api\s+100/minute\s+mesh\s+-\s+client address\s+refuse \(closed\)$`).MatchString(s) ||
		!regexp.MustCompile(`(?m)^api\s+5000 tokens/minute\s+mesh\s+-\s+value of x-tenant-id\s+let through \(open\)$`).MatchString(s) || strings.Contains(s, "open  ") {
		t.Fatalf("status:\n%s", s)
	}
}

// TestStatusMarksWhatItCouldNotRead: a node whose figures the controller
// could not read is named with why, and every rate and count that leaves
// it out is marked "?" (issue 40: they read 0.0 as if no request came).
func TestStatusMarksWhatItCouldNotRead(t *testing.T) {
	var out bytes.Buffer
	r := api.StatusReport{RateWindowS: 10,
		Endpoints: []api.EndpointStatus{{Name: "model", Route: "/model", RequestRate: 3, Backends: []api.EndpointBackendStatus{{Backend: "v1", Weight: 1, RequestRate: 3}}}},
		Backends:  []api.BackendStatus{{Name: "v1", Ready: 1, Running: 1, Desired: 1, RequestRate: 3}},
		Nodes: []api.NodeStatus{{ID: "n1", Connected: true, InSync: true}, {ID: "n2", Connected: true, InSync: true,
			FiguresUnread: "Get \"http://127.0.0.1:9/v1/load\": connection refused"}}}
	if err := printStatus(&out, r); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, re := range []string{
		`\(rates per second over the last 10s; \?: without node n2, whose figures could not be read\)`,
		`(?m)^model\s+/model\s+3\.0\?\s+v1\s+1\s+-\s+3\.0\?\s+0\.0\?$`,
		`(?m)^v1\s+1/1/1\s+0\s+0\s+false\s+0\?\s+0\?\s+3\.0\?\s+0\.0\?$`,
		`(?m)^n1\s+true\s+true\s+0\s+ready\s+read\s`,
		`(?m)^n2\s+true\s+true\s+0\s+ready\s+\? Get "http://127\.0\.0\.1:9/v1/load": connection refused\s`,
	} {
		if !regexp.MustCompile(re).MatchString(s) {
			t.Errorf("status does not match %s:\n%s", re, s)
		}
	}
	// With every node read, nothing is marked.
	r.Nodes[1].FiguresUnread = ""
	out.Reset()
	if err := printStatus(&out, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "?") {
		t.Errorf("a status with every node read marks a figure:\n%s", out.String())
	}
}
