package docs

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// release is one line of RELEASES.
type release struct{ version, commit, date, protocol string }

// readReleases parses RELEASES, failing on a line it cannot read.
func readReleases(t *testing.T) []release {
	t.Helper()
	data, err := os.ReadFile("../RELEASES")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`^(v\d+\.\d+\.\d+) ([0-9a-f]{40}) (\d{4}-\d{2}-\d{2}) (\d+)$`)
	var out []release
	for i, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("RELEASES line %d %q: want `version commit date protocol`, such as `v0.1.0 <40 hex digits> 2026-12-01 1`", i+1, l)
		}
		out = append(out, release{m[1], m[2], m[3], m[4]})
	}
	if len(out) == 0 {
		t.Fatal("RELEASES names no release")
	}
	return out
}

// TestReleasesAreRecorded: every release RELEASES names is a commit of
// this history (the upgrade tests build the newest from it), newest
// first, and CHANGELOG.md has a section for it, under one for what is not
// released yet.
func TestReleasesAreRecorded(t *testing.T) {
	releases := readReleases(t)
	changelog, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(changelog), "\n## Unreleased") {
		t.Error("CHANGELOG.md has no '## Unreleased' section for what the next release will hold")
	}
	for i, r := range releases {
		if !strings.Contains(string(changelog), "\n## "+r.version+" ("+r.date+", protocol "+r.protocol+")") {
			t.Errorf("CHANGELOG.md has no section '## %s (%s, protocol %s)'", r.version, r.date, r.protocol)
		}
		if out, err := exec.CommandContext(t.Context(), "git", "-C", "..", "cat-file", "-e", r.commit+"^{commit}").CombinedOutput(); err != nil {
			t.Errorf("release %s's commit %s is not in this history: %v %s", r.version, r.commit, err, out)
		}
		if i > 0 && r.date > releases[i-1].date {
			t.Errorf("RELEASES lists %s (%s) after %s (%s): newest first", r.version, r.date, releases[i-1].version, releases[i-1].date)
		}
	}
}
