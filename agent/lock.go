package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/servemesh/servemesh/internal/proc"
)

// lockFile, in an agent's work folder, is locked by the agent that works
// there: two agents adopting the same replicas would fight over them.
const lockFile = "agent.lock"

// LockWorkDir takes the lock of an agent's work folder (flock, so it is
// released when the process dies), failing at once, naming the agent that
// holds it and what to do, if another process holds it. It returns the
// unlock.
func LockWorkDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("agent work dir: %w", err)
	}
	unlock, err := proc.Lock(filepath.Join(dir, lockFile))
	var held *proc.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("another agent, %s, works in %s (it holds %s): it runs this node's replicas; stop it first, or give this one another --work-dir (and --node-id)", held.Holder, dir, held.Path)
	}
	return unlock, err
}
