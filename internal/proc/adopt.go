package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Identity tells one process from any other that has had, or will have,
// its pid: the pid and when the process started (in clock ticks since
// boot, field 22 of /proc/<pid>/stat). A record of a child's Identity lets
// a later process, a restarted agent, find that very child again.
type Identity struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// IdentityOf returns the Identity of the running process pid.
func IdentityOf(pid int) (Identity, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Identity{}, fmt.Errorf("process %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'.
	s := string(stat)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return Identity{}, fmt.Errorf("process %d: unreadable stat %q", pid, s)
	}
	fields := strings.Fields(s[end+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return Identity{}, fmt.Errorf("process %d: short stat %q", pid, s)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return Identity{}, fmt.Errorf("process %d has exited", pid)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Identity{}, fmt.Errorf("process %d: start time %q: %w", pid, fields[19], err)
	}
	return Identity{Pid: pid, Start: start}, nil
}

// Alive reports whether the process id names is still running.
func (id Identity) Alive() bool {
	now, err := IdentityOf(id.Pid)
	return err == nil && now == id
}

// ErrExitUnknown is the exit status of an adopted process: only its parent
// may read the real one.
var ErrExitUnknown = errors.New("exited (its exit status went to the process that started it)")

// Adopt returns the Process id names, started by another process (an
// earlier incarnation of this one) as the leader of its own process group:
// Signal, Stop and Kill reach its group, and Done closes when it exits
// (watched through a pidfd), when Wait returns ErrExitUnknown. It fails
// if no such process runs any more, or if it leads no group.
func Adopt(id Identity) (*Process, error) {
	fd, err := unix.PidfdOpen(id.Pid, 0)
	if err != nil {
		return nil, fmt.Errorf("adopt process %d: %w", id.Pid, err)
	}
	// Checked after the pidfd is open: the pid cannot be reused while we
	// hold it, so the pidfd is of the process the identity names.
	if !id.Alive() {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("adopt process %d: it is not the process recorded (exited, or its pid reused)", id.Pid)
	}
	if pgid, err := syscall.Getpgid(id.Pid); err != nil || pgid != id.Pid {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("adopt process %d: it leads no process group of its own", id.Pid)
	}
	p := &Process{pid: id.Pid, done: make(chan struct{})}
	go func() {
		defer func() { _ = unix.Close(fd) }()
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == nil && n > 0 {
				break
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				break
			}
		}
		p.err = ErrExitUnknown
		close(p.done)
	}()
	return p, nil
}
