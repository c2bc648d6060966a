package envoy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
var ErrNotFound = errors.New("envoy binary not found; run `make tools`, or set " + EnvVar + " or --envoy to its path")

// Find returns the Envoy binary to run: explicit if not empty, else
// $SERVEMESH_ENVOY, else .tools/bin/envoy next to the servemesh binary's
// folder or in the working directory (what `make tools` installs), else
// `envoy` on $PATH.
func Find(explicit string) (string, error) {
	var candidates []string
	if explicit != "" {
		candidates = append(candidates, explicit)
	} else if env := os.Getenv(EnvVar); env != "" {
		candidates = append(candidates, env)
	} else {
		if exe, err := os.Executable(); err == nil {
			candidates = append(candidates, filepath.Join(filepath.Dir(exe), "..", ".tools", "bin", "envoy"))
		}
		if wd, err := os.Getwd(); err == nil {
			for dir := wd; ; dir = filepath.Dir(dir) {
				candidates = append(candidates, filepath.Join(dir, ".tools", "bin", "envoy"))
				if filepath.Dir(dir) == dir {
					break
				}
			}
		}
		if p, err := exec.LookPath("envoy"); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, c := range candidates {
		if info, err := os.Stat(c); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return filepath.Clean(c), nil
		}
	}
	if explicit != "" || os.Getenv(EnvVar) != "" {
		return "", fmt.Errorf("envoy binary %q is not an executable file: %w", candidates[0], ErrNotFound)
	}
	return "", ErrNotFound
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
