package agent

import (
	"fmt"
	"io"
	"os"
	"strconv"
)

// replicaLog is a replica's log file. Its processes write to it directly,
// not through a pipe to the agent, so a replica keeps logging while its
// agent restarts; the agent rotates it by copying it aside and truncating
// it (what logrotate's copytruncate does for programs that cannot reopen
// their log), keeping backups older files: path.1 the newest.
type replicaLog struct {
	path     string
	maxBytes int64
	backups  int
}

// open opens the log for a process to write to (appending, so a truncate
// by rotate moves its next write to the start); only the agent's user may
// read it.
func (l replicaLog) open() (*os.File, error) {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("replica log: %w", err)
	}
	return f, nil
}

// rotate rotates the log if it has passed its cap.
func (l replicaLog) rotate() error {
	info, err := os.Stat(l.path)
	if err != nil || info.Size() <= l.maxBytes {
		return nil //nolint:nilerr // no log yet: nothing to rotate
	}
	for i := l.backups - 1; i >= 1; i-- {
		_ = os.Rename(l.backup(i), l.backup(i+1))
	}
	if err := copyFile(l.path, l.backup(1)); err != nil {
		return fmt.Errorf("rotate replica log: %w", err)
	}
	if err := os.Truncate(l.path, 0); err != nil {
		return fmt.Errorf("rotate replica log: %w", err)
	}
	return nil
}

func (l replicaLog) backup(i int) string { return l.path + "." + strconv.Itoa(i) }

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
