package envoy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// An Envoy hot restarted for an upgrade ends the one it replaced only
// after its drain and the upgrade grace, so that long answer streams end
// whole (issue 59); without a grace, 5 s after the drain, as before.
func TestAHotRestartGivesTheOldEnvoyTheUpgradeGrace(t *testing.T) {
	c := Config{ConfigPath: "/b.yaml", HotRestart: true, Epoch: 1, BaseID: 7, DrainTime: 2 * time.Second, UpgradeGrace: 10 * time.Minute}
	if args := strings.Join(c.Args(), " "); !strings.Contains(args, "--parent-shutdown-time-s 602 ") {
		t.Errorf("args %q: want --parent-shutdown-time-s 602 (the drain and the grace)", args)
	}
	c.UpgradeGrace = 0
	if args := strings.Join(c.Args(), " "); !strings.Contains(args, "--parent-shutdown-time-s 7 ") {
		t.Errorf("args %q: want --parent-shutdown-time-s 7 without a grace", args)
	}
	if strings.Contains(strings.Join(c.settings(), " "), "parent-shutdown") {
		t.Error("the parent shutdown time is among the settings every epoch shares: changing the grace would hot restart Envoy")
	}
}

// The record says when the Envoys a running one replaced are ended, so an
// agent adopting it waits for that before it would kill one; an earlier
// release's record, without it, means 5 s after the drain.
func TestTheRecordSaysWhenTheReplacedEnvoyEnds(t *testing.T) {
	c := Config{DrainTime: 2 * time.Second}
	var old envoyRecord
	if err := json.Unmarshal([]byte(`{"process":{"pid":10,"start":1},"epoch":1,"draining":[{"pid":9,"start":1}]}`), &old); err != nil {
		t.Fatal(err)
	}
	if got := old.parentShutdown(c); got != 7*time.Second {
		t.Errorf("an earlier release's record: parent shutdown %s, want 7s", got)
	}
	if !old.drainingUntil(c).IsZero() {
		t.Errorf("an earlier release's record has no start time, yet draining until %s", old.drainingUntil(c))
	}
	started := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	b, err := json.Marshal(envoyRecord{Process: old.Process, Epoch: 1, ParentShutdownS: 602, StartedAt: started})
	if err != nil {
		t.Fatal(err)
	}
	var now envoyRecord
	if err := json.Unmarshal(b, &now); err != nil {
		t.Fatal(err)
	}
	if got := now.parentShutdown(c); got != 602*time.Second {
		t.Errorf("parent shutdown %s, want 602s", got)
	}
	if got, want := now.drainingUntil(c), started.Add(602*time.Second); !got.Equal(want) {
		t.Errorf("draining until %s, want %s", got, want)
	}
}
