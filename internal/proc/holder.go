package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"
)

// Holder is a process that holds something another wanted: a listening
// port or a lock. PID is 0 when it cannot be told (a process of another
// user, whose file descriptors this one may not read).
type Holder struct {
	PID     int
	Command string
}

func (h Holder) String() string {
	switch {
	case h.PID == 0:
		return "a process it cannot name (another user's, or an older release's)"
	case h.Command == "":
		return "pid " + strconv.Itoa(h.PID)
	default:
		return fmt.Sprintf("pid %d (%s)", h.PID, h.Command)
	}
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = 0x0A

// ListenerOf names the process listening on addr (host:port, TCP), read
// from /proc; ok is false when nothing listens there.
func ListenerOf(addr string) (h Holder, ok bool) {
	fs, inodes := listening(addr)
	if len(inodes) == 0 {
		return Holder{}, false
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return Holder{}, true
	}
	for _, p := range procs {
		if holdsAny(p, inodes) {
			comm, _ := p.Comm()
			return Holder{PID: p.PID, Command: comm}, true
		}
	}
	return Holder{}, true
}

// InUseError says an address another process listens on.
type InUseError struct {
	// What the address is for ("the controller's API", ...).
	What, Addr string
	Holder     Holder
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("%s %s is in use by %s", e.What, e.Addr, e.Holder)
}

// CheckFree fails with an *InUseError when something already listens on
// addr, which is for what: a daemon says so before it starts anything,
// rather than after, in a child's log.
func CheckFree(ctx context.Context, what, addr string) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err == nil {
		return l.Close()
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: %w", what, addr, err)
	}
	h, _ := ListenerOf(addr)
	return &InUseError{What: what, Addr: addr, Holder: h}
}

// HeldError says a lock another process holds.
type HeldError struct {
	Path   string
	Holder Holder
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is locked by %s", e.Path, e.Holder)
}

// Lock takes the lock file at path (flock, released when this process
// dies, whatever way) and writes this process's pid into it, for the one
// refused to name. It fails at once with a *HeldError when another
// process holds it. It returns the unlock.
func Lock(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer func() { _ = f.Close() }()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		held := &HeldError{Path: path}
		buf := make([]byte, 32)
		if n, _ := f.ReadAt(buf, 0); n > 0 {
			held.Holder.PID, _ = strconv.Atoi(strings.TrimSpace(string(buf[:n])))
			if held.Holder.PID > 0 {
				if p, err := procfs.NewProc(held.Holder.PID); err == nil {
					held.Holder.Command, _ = p.Comm()
				}
			}
		}
		return nil, held
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil
}
