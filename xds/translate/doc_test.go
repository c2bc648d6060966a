package translate

import (
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
)

// TestPackageDocMapsEveryFile: the package doc's file map names every
// file of the package, and no file that is not there.
func TestPackageDocMapsEveryFile(t *testing.T) { testutil.PackageDocNamesEveryFile(t) }
