package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// previousRun is the folder, in an agent's work folder, that keeps the
// replica folders and logs of the agent's previous run; older runs are
// removed, so they do not pile up.
const previousRun = "previous-run"

// stateFiles are the agent's own state in its work folder, which outlives
// every run: the adopted replicas' records, the lock and the backends'
// user ids (losing those gave a backend's new replica another backend's
// user, which read that backend's secrets).
var stateFiles = []string{runningDir, lockFile, usersFile}

// keepOnlyPreviousRun moves what the previous run left in dir (replica
// folders and logs) into dir/previous-run, replacing the run kept there;
// the names in keep (adopted replicas' folders and logs) and the agent's
// stateFiles stay.
func keepOnlyPreviousRun(dir string, keep []string) error {
	prev := filepath.Join(dir, previousRun)
	if err := os.RemoveAll(prev); err != nil {
		return fmt.Errorf("remove the logs of older runs: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read the work folder: %w", err)
	}
	entries = slices.DeleteFunc(entries, func(e os.DirEntry) bool {
		return slices.Contains(keep, e.Name()) || slices.Contains(stateFiles, e.Name())
	})
	if len(entries) == 0 {
		return nil
	}
	if err := os.Mkdir(prev, 0o700); err != nil {
		return fmt.Errorf("keep the previous run's logs: %w", err)
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(prev, e.Name())); err != nil {
			return fmt.Errorf("keep the previous run's logs: %w", err)
		}
	}
	return nil
}
