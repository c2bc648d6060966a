//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// tryBlock is the banner's "Try:" block as a user copies it: its lines
// up to the first blank one.
func tryBlock(banner string) string {
	_, rest, ok := strings.Cut(banner, "Try:\n")
	if !ok {
		return ""
	}
	block, _, _ := strings.Cut(rest, "\n\n")
	return block + "\n"
}

// TestDemoBannerPastedAsOneBlock: the demo banner's "Try:" block, copied
// whole and pasted into a shell as a newcomer does, runs line after line
// with no pause between them, every line without error (the shell stops
// at the first that fails), and each prints what its comment promises:
// the split counted by backend, 405 for a method the endpoint does not
// take, prompt affinity, five requests then 429 under the rate limit
// created just before, 429 past the token quota created just before, and
// the traced request's trace read back from Jaeger right after it.
// (TestDemoStack runs the lines one by one; two once failed only when
// pasted together.)
func TestDemoBannerPastedAsOneBlock(t *testing.T) {
	t.Parallel()
	d := startDemoStack(t)
	block := tryBlock(d.out.String())
	if !strings.Contains(block, "export SERVEMESH_SERVER=") {
		t.Fatalf("no Try: block in the banner:\n%s", d.out.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	shell := exec.CommandContext(ctx, "bash", "-e", "-s")
	shell.Stdin = strings.NewReader(block)
	shell.Env = slices.DeleteFunc(os.Environ(), func(v string) bool { return strings.HasPrefix(v, "SERVEMESH_SERVER=") })
	out, err := shell.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("the pasted block stopped: %v\n%s", err, text)
	}
	for what, want := range map[string]*regexp.Regexp{
		"the split counted by backend":             regexp.MustCompile(`(?m)^\s*\d+ model-v1$`),
		"405 with an Allow header":                 regexp.MustCompile(`(?m)^HTTP/1\.1 405 .*$`),
		"prompt affinity":                          regexp.MustCompile(`(?m)^llama#[0-9a-f]{6} prompt blocks cached: \d+ of \d+$`),
		"five requests, then 429 (the rate limit)": regexp.MustCompile(`(?m)^200 200 200 200 200 429 429 $`),
		"200s, then 429 (the token quota)":         regexp.MustCompile(`(?m)^(200 )+429 `),
		"the traced request's trace, from Jaeger":  regexp.MustCompile(`"operationName": "model"`),
		"the mesh's services in Consul's catalog":  regexp.MustCompile(`(?m)^model-v1\b`),
	} {
		if !want.MatchString(text) {
			t.Errorf("the pasted block printed nothing for %s (%s):\n%s", what, want, text)
		}
	}
	d.stop(t) // as Ctrl-C: everything it started stops
}
