package server

import (
	"testing"

	"github.com/servemesh/servemesh/internal/testutil"
)

// TestPackageDocMapsEveryFile: the package doc's data path names every
// file of the package, and no file that is not there.
func TestPackageDocMapsEveryFile(t *testing.T) { testutil.PackageDocNamesEveryFile(t) }
