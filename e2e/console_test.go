//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/servemesh/servemesh/meshspec"
)

// chromiumBin is Debian's Chromium, which `make tools` installs.
func chromiumBin(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the real Chromium is required (`make tools` installs Debian's chromium): %v", err)
	}
	return path
}

// TestConsole loads the controller's web console in a real headless
// Chromium, on the default mesh (mTLS, two nodes) with a controller that
// requires tokens: without a token it says so; with the token entered once
// it draws the endpoint's split, its shadow, the replicas on each node and
// the nodes in sync; a split changed with the CLI shows up within seconds
// without a reload; the page's own form changes the split through the API;
// a replica killed and restarted shows its restart; and a screenshot is
// saved (.run/artifacts/console.png).
func TestConsole(t *testing.T) {
	t.Parallel()
	browser := chromiumBin(t)
	token := "console-token-0123456789abcdef"
	mesh := startTwoNodeMeshWith(t, "console", []string{"--token-file", writeToken(t, token)}, nil)
	ctx := context.Background()
	for _, name := range []string{"cstable", "ccanary"} {
		mesh.createBackends(t, meshspec.Backend{Name: name, Config: meshspec.BackendConfig{NumReplicas: 1, CPUs: 1}, Process: demoProcess(name, false)})
	}
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "site", Route: "/site", Traffic: map[string]float64{"cstable": 0.9, "ccanary": 0.1},
		Shadows:   map[string]float64{"ccanary": 0.25},
		RateLimit: &meshspec.RateLimit{Local: &meshspec.LocalRateLimit{RequestsPerSecond: 100000, Header: "x-tenant-id"}}}); err != nil {
		t.Fatal(err)
	}
	waitReplicasAnswer(t, "the endpoint to answer", "http://"+mesh.n1.public+"/site", 2, 40)
	l := startLoad("http://"+mesh.n1.public+"/site", 2)
	defer func() { close(l.stop); l.wg.Wait() }()

	page := browserPage(t, browser)
	url := "http://" + mesh.ctl.apiAddr + "/ui/"

	// Without a token: the page loads and says the API wants one.
	if err := chromedp.Do(page, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	waitText(page, t, "#error", "bearer token")

	// The token, entered once: the page draws the mesh.
	if err := chromedp.Do(page, chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#token-form button"))); err != nil {
		t.Fatal(err)
	}
	waitText(page, t, "#endpoint-site .bar", "cstable 90%")
	waitText(page, t, "#endpoint-site", "mirrors 25%")
	waitText(page, t, "#endpoint-site .rate-limit", "rate limit 100000/s each node per x-tenant-id, burst 100000")
	waitText(page, t, "#backend-cstable", "1 / 1 / 1")
	waitText(page, t, "#node-console-n1", "✓ in sync")
	waitText(page, t, "#node-console-n2", "✓ in sync")
	waitText(page, t, "#node-console-n1 .components", "✓")
	// Each endpoint's split has column headers; a backend's rates say
	// they are the backend's, over every endpoint (issue 62, 6).
	waitText(page, t, "#endpoint-site table.split thead", "backend's req/s")

	// A change made with the CLI appears without a reload.
	env := []string{"SERVEMESH_SERVER=" + mesh.ctl.apiAddr, "SERVEMESH_TOKEN_FILE=" + mesh.ctl.tokenFile()}
	changed := time.Now()
	expectCLI(t, env, 0, "", "traffic", "set", "site", "cstable=0.6", "ccanary=0.4")
	waitText(page, t, "#endpoint-site .bar", "cstable 60%")
	t.Logf("the console showed the CLI's change %s after it was made", time.Since(changed).Round(10*time.Millisecond))

	// The page's form changes the split through the API (the page does
	// not redraw a form that has the focus).
	stableInput, canaryInput := chromedp.CSS(`#endpoint-site input[name="cstable"]`), chromedp.CSS(`#endpoint-site input[name="ccanary"]`)
	if err := chromedp.Do(page,
		chromedp.Click(stableInput), chromedp.SetValue(stableInput, "0.3"),
		chromedp.Click(canaryInput), chromedp.SetValue(canaryInput, "0.7"),
		chromedp.Click(chromedp.CSS(`#endpoint-site .split-form button`))); err != nil {
		t.Fatal(err)
	}
	waitText(page, t, "#endpoint-site .bar", "cstable 30%")
	e, err := mesh.c.GetEndpoint(ctx, "site")
	if err != nil || e.Traffic["ccanary"] != 0.7 {
		t.Fatalf("after the console's change the endpoint is %+v (%v); want ccanary at 0.7", e.Traffic, err)
	}

	// An endpoint routed by model shows a split per model, each with its
	// form, which sets that model's split alone (issue 40: no form).
	if _, err := mesh.c.CreateEndpoint(ctx, meshspec.Endpoint{Name: "chat", Route: "/chat", Methods: []string{"POST"},
		ModelRouting: &meshspec.ByModel{Models: map[string]meshspec.TrafficPolicy{
			"m1": {Traffic: map[string]float64{"cstable": 0.5, "ccanary": 0.5}}, "m2": {Traffic: map[string]float64{"ccanary": 1}}}}}); err != nil {
		t.Fatal(err)
	}
	waitText(page, t, "#endpoint-chat", "model m1")
	waitText(page, t, `#endpoint-chat form[data-model="m2"]`, "set m2's split")
	m1Stable, m1Canary := chromedp.CSS(`#endpoint-chat form[data-model="m1"] input[name="cstable"]`), chromedp.CSS(`#endpoint-chat form[data-model="m1"] input[name="ccanary"]`)
	if err := chromedp.Do(page,
		chromedp.Click(m1Stable), chromedp.SetValue(m1Stable, "0.2"),
		chromedp.Click(m1Canary), chromedp.SetValue(m1Canary, "0.8"),
		chromedp.Click(chromedp.CSS(`#endpoint-chat form[data-model="m1"] button`))); err != nil {
		t.Fatal(err)
	}
	waitText(page, t, "#endpoint-chat .bar", "ccanary 80%")
	chat, err := mesh.c.GetEndpoint(ctx, "chat")
	if err != nil || chat.ModelRouting.Models["m1"].Traffic["ccanary"] != 0.8 || chat.ModelRouting.Models["m2"].Traffic["ccanary"] != 1 {
		t.Fatalf("after the console's change of m1's split: %+v (%v)", chat.ModelRouting, err)
	}
	waitText(page, t, "#node-console-n1 .figures", "read") // the controller reads every node's figures

	// A replica whose process dies is restarted by its agent, which the
	// page says.
	pids := mesh.replicaPids("cstable")
	if len(pids) != 1 {
		t.Fatalf("cstable's replica processes: %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitText(page, t, "#backend-cstable", "restarted 1×")

	waitText(page, t, "#node-console-n1", "✓ in sync") // the page as it settles, for the screenshot
	waitText(page, t, "#node-console-n2", "✓ in sync")
	shot, err := chromedp.Run(page, chromedp.FullScreenshot(100)) // 100: a PNG
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.Abs("../.run/artifacts")
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "console.png"), shot, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", filepath.Join(dir, "console.png"), len(shot))
}

// waitText waits until the element sel's text holds want.
// browserPage is a page of a real headless Chromium at browser, closed
// with the test, bounded to two minutes.
func browserPage(t *testing.T, browser string) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 1000))...)
	page, cancelPage := chromedp.NewContext(alloc)
	page, cancelTimeout := context.WithTimeout(page, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelPage(); cancelAlloc() })
	return page
}

func waitText(page context.Context, t *testing.T, sel, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(page, 2*time.Second)
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		cancel()
		if err == nil {
			got = text
		}
		if err == nil && strings.Contains(got, want) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the console's %s says %q; want %q", sel, got, want)
}
