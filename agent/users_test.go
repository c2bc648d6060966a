package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackendUsersSurviveRestarts: the backends' user ids outlive any
// number of agent restarts, each of which loads them and then moves the
// previous run aside (issue 58, H2: the file was moved aside with the
// replicas' logs, so the second restart lost it, and a new backend's
// replica was given a running backend's user and read its secrets).
func TestBackendUsersSurviveRestarts(t *testing.T) {
	dir := t.TempDir()
	r := UIDRange{First: 2_000_000_000, Count: 10}
	restart := func() *backendUsers {
		t.Helper()
		u, err := loadBackendUsers(r, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := keepOnlyPreviousRun(dir, nil); err != nil {
			t.Fatal(err)
		}
		return u
	}
	uidOf := func(u *backendUsers, backend string) uint32 {
		t.Helper()
		c, err := u.credential(backend)
		if err != nil {
			t.Fatal(err)
		}
		return c.Uid
	}
	u := restart()
	a, b := uidOf(u, "a"), uidOf(u, "b")
	if a == b {
		t.Fatalf("backends a and b share user %d", a)
	}
	for i := range 3 {
		u = restart()
		if got := uidOf(u, "a"); got != a {
			t.Fatalf("after restart %d: backend a runs as %d, was %d", i+1, got, a)
		}
		if c := uidOf(u, "c"); c == a || c == b {
			t.Fatalf("after restart %d: the new backend c was given %d, which a (%d) or b (%d) has", i+1, c, a, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, usersFile)); err != nil {
		t.Fatalf("the users file left the work folder: %v", err)
	}
}

// TestRunningReplicasClaimTheirUsers: the users adopted replicas run as
// are their backends' before any backend is given one, so that a lost
// users file gives no running backend's user to another; a replica that
// runs as another backend's user is refused.
func TestRunningReplicasClaimTheirUsers(t *testing.T) {
	r := UIDRange{First: 2_000_000_000, Count: 10}
	u, err := loadBackendUsers(r, t.TempDir()) // the file lost
	if err != nil {
		t.Fatal(err)
	}
	if err := u.claim("a", r.First); err != nil {
		t.Fatalf("a's running replica's user: %v", err)
	}
	if err := u.claim("a", r.First); err != nil {
		t.Fatalf("a's second replica, the same user: %v", err)
	}
	if c, err := u.credential("b"); err != nil || c.Uid == r.First {
		t.Fatalf("backend b given %v (%v); want another user than a's %d", c, err, r.First)
	}
	if err := u.claim("c", r.First); err == nil || !strings.Contains(err.Error(), "backend a's") {
		t.Fatalf("a replica of c running as a's user: %v; want it refused, naming a", err)
	}
	if err := u.claim("a", r.First+5); err == nil {
		t.Fatal("a replica of a running as another user than a's was taken")
	}
	if err := u.claim("old", 65534); err != nil {
		t.Fatalf("a user outside the range (an earlier release's nobody): %v; want it left alone", err)
	}
}

// TestADeletedBackendsUserIsNeverGivenAgain: a backend deleted and created
// again under its name runs as a new user, so it cannot read what the old
// one's replicas left as theirs; the old user is given to no backend,
// across restarts too (issue 58, H2).
func TestADeletedBackendsUserIsNeverGivenAgain(t *testing.T) {
	dir := t.TempDir()
	r := UIDRange{First: 2_000_000_000, Count: 10}
	u, err := loadBackendUsers(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	uidOf := func(backend string) uint32 {
		t.Helper()
		c, err := u.credential(backend)
		if err != nil {
			t.Fatal(err)
		}
		return c.Uid
	}
	old, kept := uidOf("a"), uidOf("b")
	if err := u.retire(map[string]bool{"b": true}); err != nil { // a deleted
		t.Fatal(err)
	}
	if again := uidOf("a"); again == old || again == kept {
		t.Fatalf("backend a created again runs as %d; its first run's user was %d (and b's is %d): want a new one", again, old, kept)
	}
	if u, err = loadBackendUsers(r, dir); err != nil {
		t.Fatal(err)
	}
	if got := uidOf("b"); got != kept {
		t.Fatalf("after a restart b runs as %d, was %d", got, kept)
	}
	for _, name := range []string{"c", "d", "e"} {
		if id := uidOf(name); id == old {
			t.Fatalf("after a restart, new backend %s was given the deleted a's user %d", name, old)
		}
	}
}
