package proc

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckFreeNamesTheListener(t *testing.T) {
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	addr := l.Addr().String()
	h, ok := ListenerOf(addr)
	if !ok || h.PID != os.Getpid() {
		t.Fatalf("ListenerOf(%s) = %+v, %v; want this process, %d", addr, h, ok, os.Getpid())
	}
	err = CheckFree(t.Context(), "the controller's API", addr)
	var inUse *InUseError
	if !errors.As(err, &inUse) || inUse.Holder.PID != os.Getpid() || !strings.Contains(err.Error(), "the controller's API "+addr+" is in use by pid") {
		t.Fatalf("CheckFree of a held port: %v", err)
	}
	free, err := FreeAddr(t.Context(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckFree(t.Context(), "x", free); err != nil {
		t.Fatalf("CheckFree of a free port: %v", err)
	}
	if _, ok := ListenerOf(free); ok {
		t.Fatalf("ListenerOf a free port found a listener")
	}
}

func TestLockNamesItsHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "x.lock")
	unlock, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to an open file: a second open, even in this
	// process, is refused.
	_, err = Lock(path)
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.PID != os.Getpid() || !strings.Contains(err.Error(), "locked by pid") {
		t.Fatalf("a second lock: %v; want it refused, naming this process", err)
	}
	unlock()
	unlock, err = Lock(path)
	if err != nil {
		t.Fatalf("the lock once released: %v", err)
	}
	unlock()
}
