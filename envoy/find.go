package envoy

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"

	"github.com/servemesh/servemesh/internal/toolpath"
)

// EnvVar names the environment variable that points at an Envoy binary.
const EnvVar = "SERVEMESH_ENVOY"

// MinVersion is the oldest Envoy servemesh configures.
var MinVersion = Version{Major: 1, Minor: 30}

// Version is an Envoy release number.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than o.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// ErrNotFound means no Envoy binary was found anywhere servemesh looks.
var ErrNotFound = toolpath.ErrNotFound

// Find returns the Envoy binary to run: explicit if not empty, else
// $SERVEMESH_ENVOY, else .tools/bin/envoy next to the servemesh binary's
// folder or in the working directory (what `make tools` installs), else
// `envoy` on $PATH.
func Find(explicit string) (string, error) {
	p, err := toolpath.Find("envoy", EnvVar, explicit)
	if err != nil {
		return "", fmt.Errorf("%w (or pass --envoy)", err)
	}
	return p, nil
}

var versionPattern = regexp.MustCompile(`version: [0-9a-f]+/(\d+)\.(\d+)\.(\d+)`)

// ParseVersion reads the release out of `envoy --version` output.
func ParseVersion(out string) (Version, error) {
	m := versionPattern.FindStringSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("no Envoy version in %q", out)
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	v.Patch, _ = strconv.Atoi(m[3])
	return v, nil
}

// CheckVersion runs `binary --version` and refuses Envoys older than MinVersion.
func CheckVersion(ctx context.Context, binary string) (Version, error) {
	out, err := exec.CommandContext(ctx, binary, "--version").CombinedOutput()
	if err != nil {
		return Version{}, fmt.Errorf("run %s --version: %w (output: %q)", binary, err, out)
	}
	v, err := ParseVersion(string(out))
	if err != nil {
		return Version{}, fmt.Errorf("%s: %w", binary, err)
	}
	if v.Less(MinVersion) {
		return v, fmt.Errorf("%s is Envoy %s; servemesh needs %s or newer", binary, v, MinVersion)
	}
	return v, nil
}
