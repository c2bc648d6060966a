package toolpath

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNotFound means the program is nowhere servemesh looks.
var ErrNotFound = errors.New("not found")

// Find returns the path of program name. explicit wins, then $envVar; if
// either is set but not an executable file, that is an error rather than a
// fallback.
func Find(name, envVar, explicit string) (string, error) {
	var candidates []string
	switch {
	case explicit != "":
		candidates = []string{explicit}
	case os.Getenv(envVar) != "":
		candidates = []string{os.Getenv(envVar)}
	default:
		if exe, err := os.Executable(); err == nil {
			candidates = append(candidates, filepath.Join(filepath.Dir(exe), "..", ".tools", "bin", name))
		}
		if wd, err := os.Getwd(); err == nil {
			for dir := wd; ; dir = filepath.Dir(dir) {
				candidates = append(candidates, filepath.Join(dir, ".tools", "bin", name))
				if filepath.Dir(dir) == dir {
					break
				}
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, c := range candidates {
		if info, err := os.Stat(c); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return filepath.Clean(c), nil
		}
	}
	if explicit != "" || os.Getenv(envVar) != "" {
		return "", fmt.Errorf("%s binary %q is not an executable file: %w", name, candidates[0], ErrNotFound)
	}
	return "", fmt.Errorf("%s binary: %w; run `make tools`, or set $%s", name, ErrNotFound, envVar)
}

// Under returns the path of rel under the project's .tools (what `make
// tools` installs): next to the running binary, else in the working
// directory or a parent. It fails, saying to run `make tools`, if rel is
// in none.
func Under(rel string) (string, error) {
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), "..", ".tools", rel))
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			candidates = append(candidates, filepath.Join(dir, ".tools", rel))
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			abs, err := filepath.Abs(c)
			if err != nil {
				return "", err
			}
			return abs, nil
		}
	}
	return "", fmt.Errorf(".tools/%s: %w; run `make tools`", rel, ErrNotFound)
}
