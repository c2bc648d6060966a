package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockFile, in an agent's work folder, is locked by the agent that works
// there: two agents adopting the same replicas would fight over them.
const lockFile = "agent.lock"

// LockWorkDir takes the lock of an agent's work folder (flock, so it is
// released when the process dies), failing at once, with what to do, if
// another process holds it. It returns the unlock.
func LockWorkDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("agent work dir: %w", err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another agent works in %s (it holds %s); stop it first, or give this one another --work-dir", dir, path)
		}
		return nil, fmt.Errorf("agent lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}
