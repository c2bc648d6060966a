package picker

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/meshspec"
)

// restartedPicker is a picker of testPicker's mesh after its agent
// restarted: it read the checkpoint at path, and the agent tracks the
// three replicas again, adopting those in adopted (Resume).
func restartedPicker(t *testing.T, path string, adopted ...string) *Picker {
	t.Helper()
	m := &meshspec.Model{Backends: []meshspec.Backend{{Name: "llama", Config: meshspec.BackendConfig{MaxConcurrentQueries: 2,
		LoadAware: &meshspec.LoadAware{SessionHeader: "x-session-id"}}}}}
	view := nodeview.New(m, "n1")
	p := New(func() *nodeview.View { return view })
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	if err := p.Restore(path); err != nil {
		t.Fatal(err)
	}
	for i, tag := range []string{"llama#000001", "llama#000002", "llama#000003"} {
		p.Track(tag, "llama", fmt.Sprintf("127.0.0.1:900%d", i+1))
		p.SetReady(tag, true)
	}
	for _, tag := range adopted {
		p.Resume(tag)
	}
	return p
}

// TestACheckpointKeepsWhatThePickerLearned: what a picker learned (where
// each prompt went and each conversation) survives its agent's restart,
// for the replicas the new agent adopts: each prompt is expected where it
// went (a hit), each conversation goes back to its replica. A replica the
// new agent started anew holds nothing. The checkpoint holds hashes, not
// a prompt or a session id, and only its owner reads it.
func TestACheckpointKeepsWhatThePickerLearned(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{SessionHeader: "x-session-id"})
	prompts := []string{"a", "b", "c", "d", "e", "f"}
	went := map[string]string{}
	for _, s := range prompts {
		c := pickNow(t, p, request{blocks: longPrompt(s), session: "chat-" + s})
		went[s] = c.replica.tag
		p.done(c, 10*time.Millisecond, http.StatusOK)
	}
	path := filepath.Join(t.TempDir(), CheckpointFile)
	written := uint64(0)
	if err := p.writeCheckpoint(path, &written); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("the checkpoint's mode: %v (%v), want 0600", info.Mode(), err)
	}
	data, _ := os.ReadFile(path)
	for _, secret := range []string{"chat-a", strings.Repeat("a", 64)} {
		if strings.Contains(string(data), secret) {
			t.Fatalf("the checkpoint holds %q, what a client sent", secret)
		}
	}

	q := restartedPicker(t, path, "llama#000001", "llama#000002", "llama#000003")
	for _, s := range prompts {
		c := pickNow(t, q, request{blocks: longPrompt(s)})
		if c.replica.tag != went[s] || c.prefixHit != 1 {
			t.Errorf("after the restart prompt %s went to %s (expected to hold %.0f%% of it); before, to %s", s, c.replica.tag, 100*c.prefixHit, went[s])
		}
		q.done(c, 10*time.Millisecond, http.StatusOK)
		if c := pickNow(t, q, request{session: "chat-" + s}); c.replica.tag != went[s] || c.why != pickedSession {
			t.Errorf("after the restart conversation chat-%s went to %s (%s); before, to %s", s, c.replica.tag, c.why, went[s])
		} else {
			q.done(c, 10*time.Millisecond, http.StatusOK)
		}
	}

	fresh := restartedPicker(t, path) // every replica started anew
	for _, s := range prompts {
		if c := pickNow(t, fresh, request{blocks: longPrompt(s)}); c.prefixHit != 0 {
			t.Errorf("prompt %s is expected on %s, a replica started anew: its cache is empty", s, c.replica.tag)
		}
	}
}

// TestACheckpointWrittenOnlyWhenChanged: the checkpoint is written again
// only after what it holds changed.
func TestACheckpointWrittenOnlyWhenChanged(t *testing.T) {
	p, _ := testPicker(t, &meshspec.LoadAware{})
	path := filepath.Join(t.TempDir(), CheckpointFile)
	written := uint64(0)
	if err := p.writeCheckpoint(path, &written); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := p.writeCheckpoint(path, &written); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the checkpoint was written again with nothing changed (%v)", err)
	}
	pickNow(t, p, request{blocks: longPrompt("a")})
	if err := p.writeCheckpoint(path, &written); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a changed picker's checkpoint was not written: %v", err)
	}
}

// TestABadCheckpointIsNotRead: a checkpoint that is not one, or of
// another version, is refused with an error naming it, and the picker
// starts empty; none at all is no error.
func TestABadCheckpointIsNotRead(t *testing.T) {
	dir := t.TempDir()
	p := New(func() *nodeview.View { return nil })
	if err := p.Restore(filepath.Join(dir, "absent.json")); err != nil {
		t.Fatalf("no checkpoint: %v, want none", err)
	}
	for name, body := range map[string]string{
		"garbage.json": "{not json",
		"version.json": `{"version": 99, "sessions": [{"backend": "llama", "hash": "x", "replica": "llama#000001"}]}`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		err := p.Restore(path)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
		if len(p.sessions.saved()) != 0 {
			t.Errorf("%s: a refused checkpoint restored sessions", name)
		}
	}
}

// TestACheckpointKeepsPrefillRates: a replica the new agent adopts keeps
// the prefill rate its cold prefills showed (token load's valve works at
// once after a restart), unless the backend's spec changed meanwhile; a
// replica started anew has none.
func TestACheckpointKeepsPrefillRates(t *testing.T) {
	p, _ := tokenPicker(t, 100)
	c := pickNow(t, p, request{blocks: sharedPrompt("q1")})
	p.done(c, 100*time.Millisecond, http.StatusOK)
	tag, rate := c.replica.tag, c.replica.PrefillRate
	if rate <= 0 {
		t.Fatalf("no rate measured from a cold prefill of %d tokens", c.tokens)
	}
	path := filepath.Join(t.TempDir(), CheckpointFile)
	written := uint64(0)
	if err := p.writeCheckpoint(path, &written); err != nil {
		t.Fatal(err)
	}
	restarted := func(userConfig string, adopt bool) float64 {
		t.Helper()
		q, view := tokenPicker(t, 100)
		view(userConfig)
		if err := q.Restore(path); err != nil {
			t.Fatal(err)
		}
		if adopt {
			q.Resume(tag)
		}
		return q.replicas[tag].PrefillRate
	}
	if got := restarted(`{}`, true); got != rate {
		t.Errorf("the adopted replica's prefill rate after the restart: %v, want %v", got, rate)
	}
	if got := restarted(`{}`, false); got != 0 {
		t.Errorf("a replica started anew has a prefill rate of %v, want none", got)
	}
	if got := restarted(`{"engine":"faster"}`, true); got != 0 {
		t.Errorf("after the backend's spec changed the adopted replica kept its rate %v, want none (measured afresh)", got)
	}
}
