//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestDocsSite builds the docs site as make docs does, with MkDocs (from
// PyPI, installed by make tools) in strict mode, so a link or an anchor
// that resolves to nothing fails it, and opens it in a real headless
// Chromium: the home page's navigation reaches the configuration and CLI
// references, and the configuration reference shows a field the code
// declares (unit tests hold the references to the code: meshspec
// TestConfigReferenceIsTheCode, cmd/servemesh TestCLIReferenceIsTheCode).
func TestDocsSite(t *testing.T) {
	t.Parallel()
	mkdocs, err := filepath.Abs("../.tools/docs-venv/bin/mkdocs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mkdocs); err != nil {
		t.Fatalf("MkDocs is required (`make tools` installs it from PyPI): %v", err)
	}
	browser := chromiumBin(t)
	site := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, mkdocs, "build", "--strict", "--site-dir", site)
	build.Dir = ".."
	build.Env = append(os.Environ(), "NO_MKDOCS_2_WARNING=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("mkdocs build --strict: %v\n%s", err, out)
	}

	page := browserPage(t, browser)
	nav := pageText(page, t, filepath.Join(site, "index.html"), "nav.md-nav--primary")
	for _, want := range []string{"Configuration", "CLI", "Upgrading", "Architecture"} {
		if !strings.Contains(nav, want) {
			t.Errorf("the site's navigation has no %q: %q", want, nav)
		}
	}
	field := pageText(page, t, filepath.Join(site, "reference", "config", "index.html"), "article")
	if !strings.Contains(field, "prefix_cache_tokens") || !strings.Contains(field, "BackendSpec") {
		t.Errorf("the configuration reference page does not show the code's fields (prefix_cache_tokens, BackendSpec): %.300q", field)
	}
	usage := pageText(page, t, filepath.Join(site, "reference", "cli", "servemesh_backend_create", "index.html"), "article")
	if !strings.Contains(usage, "--load-prefix-cache-tokens") {
		t.Errorf("the CLI reference's backend create page does not list its flags: %.300q", usage)
	}
}

// pageText is the text of the first element sel selects on the page at
// path, opened in the browser.
func pageText(page context.Context, t *testing.T, path, sel string) string {
	t.Helper()
	if err := chromedp.Do(page, chromedp.Navigate("file://"+path)); err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	text, err := chromedp.Run(page, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("%s on %s: %v", sel, path, err)
	}
	return text
}
