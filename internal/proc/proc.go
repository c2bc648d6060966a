// Package proc starts and stops child processes the one way servemesh
// does it everywhere (Envoy, replicas, the demo stack, Consul in tests):
// each child leads its own process group and is killed if its parent dies
// (Pdeathsig) unless it is Detached, and Stop sends SIGTERM, then SIGKILL
// after a grace period, to the whole group, so a child's own children go
// with it. A detached child outlives its parent; a later process finds it
// again by its Identity and Adopts it (a restarted agent, its replicas and
// Envoy). FreeAddr finds a port to listen on; CheckFree and Lock refuse,
// naming the process that holds it (ListenerOf), a port or a folder
// another daemon already has; restart delays are package backoff's.
package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Spec is how to run a child.
type Spec struct {
	Path string
	Args []string
	// Env is the child's whole environment; nil inherits this process's.
	Env            []string
	Dir            string
	Stdout, Stderr io.Writer
	// Credential, if set, is the user and group the child runs as.
	Credential *syscall.Credential
	// Detached children outlive this process (no Pdeathsig): for the data
	// plane an agent leaves serving when it restarts, to be adopted.
	Detached bool
}

// Process is a running child, or an adopted process (see Adopt).
type Process struct {
	cmd  *exec.Cmd // nil when adopted
	pid  int
	done chan struct{}
	err  error // set before done closes
}

// Start starts the child in its own process group, to die with its parent
// unless it is Detached.
func Start(s Spec) (*Process, error) {
	// Not CommandContext: a child outlives the call that starts it, and Stop
	// ends it gracefully rather than with the SIGKILL a context would send.
	cmd := exec.Command(s.Path, s.Args...) //nolint:noctx // see above
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = s.Env, s.Dir, s.Stdout, s.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true, Credential: s.Credential}
	if s.Detached {
		cmd.SysProcAttr.Pdeathsig = 0
	}
	// Output that is not a file goes through a pipe; a grandchild holding
	// it open must not keep Wait from returning once the child is gone.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Path, err)
	}
	p := &Process{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id (and its process group's).
func (p *Process) Pid() int { return p.pid }

// Identity is the child's Identity, to record for a later Adopt; zero if
// it has exited already.
func (p *Process) Identity() Identity {
	id, _ := IdentityOf(p.pid)
	return id
}

// Done is closed when the child has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits for the child to exit and returns its exit status.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// Signal sends sig to the child's whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %d to process group %d: %w", sig, p.Pid(), err)
	}
	return nil
}

// Stop sends SIGTERM to the process group and SIGKILL if the child has not
// exited within grace. It returns when the child is gone, with its exit
// status (a child stopped by a signal reports it).
func (p *Process) Stop(grace time.Duration) error {
	if !p.Exited() {
		_ = p.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.Signal(syscall.SIGKILL)
		}
	}
	return p.Wait()
}

// Kill sends SIGKILL to the process group, as a crash would, and waits.
func (p *Process) Kill() error {
	_ = p.Signal(syscall.SIGKILL)
	return p.Wait()
}

// LogTail returns up to the last n bytes of a log file, for error messages.
func LogTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer func() { _ = f.Close() }()
	if info, err := f.Stat(); err == nil && info.Size() > n {
		_, _ = f.Seek(info.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
