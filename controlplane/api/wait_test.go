package api

import (
	"context"
	"strings"
	"testing"

	"github.com/servemesh/servemesh/meshspec"
)

func TestReadiness(t *testing.T) {
	replica := func(tag, node string, ready bool, note string) ReplicaStatus {
		return ReplicaStatus{Tag: tag, Node: node, State: meshspec.Running, Ready: ready, Note: note}
	}
	report := StatusReport{Backends: []BackendStatus{
		{Name: "half", Desired: 4, Ready: 2, Replicas: []ReplicaStatus{replica("h1", "n1", true, ""), replica("h2", "n1", false, "connection refused"),
			replica("h3", "n2", true, ""), replica("h4", "n2", false, ""), {Tag: "old", Node: "n2", State: meshspec.Draining}}},
		{Name: "done", Desired: 1, Ready: 1, Replicas: []ReplicaStatus{replica("d1", "n1", true, "")}},
		{Name: "crashing", Desired: 1, Replicas: []ReplicaStatus{replica("c1", "n2", false,
			"dial tcp: connection refused; the replica's process exited 3 times; the last: exit status 1; its log ends: panic: no model file")}},
		{Name: "unplaced", Desired: 3},
	}, Problems: []string{PlacementProblemPrefix("unplaced") + "cannot scale backend \"unplaced\" to 3 replicas: ..."}}

	ps, err := readiness(report, []string{"half", "done"})
	if err != nil {
		t.Fatal(err)
	}
	if got := ps[0].String(); got != "half: 2/4 ready (n1 1/2, n2 1/2)" || ps[0].Done() {
		t.Errorf("half: %q (done %v)", got, ps[0].Done())
	}
	if !ps[1].Done() {
		t.Errorf("done is not done: %+v", ps[1])
	}
	if _, err := readiness(report, []string{"crashing"}); err == nil || !strings.Contains(err.Error(), "crash-looping") || !strings.Contains(err.Error(), "no model file") {
		t.Errorf("crashing: %v; want crash-looping with the end of its log", err)
	}
	if _, err := readiness(report, []string{"unplaced"}); err == nil || !strings.Contains(err.Error(), "cannot scale") {
		t.Errorf("unplaced: %v; want the placement problem", err)
	}
	if _, err := readiness(report, []string{"gone"}); err == nil {
		t.Error("a backend not in the status: no error")
	}
	err = notReadyError(report, ps, context.DeadlineExceeded)
	if !strings.Contains(err.Error(), "replica h2 on n1: connection refused") || strings.Contains(err.Error(), "done:") {
		t.Errorf("not ready: %v", err)
	}
}
