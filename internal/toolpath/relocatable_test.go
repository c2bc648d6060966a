package toolpath

import (
	"os"
	"path/filepath"
	"testing"
)

// TestToolLinksAreRelative: the links make tools leaves in .tools point
// inside it by relative paths, so a moved or copied clone runs its own
// tools, not the old tree's.
func TestToolLinksAreRelative(t *testing.T) {
	bin := filepath.Join("..", "..", ".tools", "bin")
	entries, err := os.ReadDir(bin)
	if err != nil {
		t.Skipf("no tools installed here (%v): nothing to check", err)
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(bin, e.Name()))
		if err != nil {
			continue // not a link
		}
		if filepath.IsAbs(target) {
			t.Errorf(".tools/bin/%s links to the absolute %s; run make tools, which makes it relative", e.Name(), target)
		}
	}
}
