package proc

import (
	"context"
	"net"
	"os"
	"testing"
	"time"
)

// TestListenerInGroup: a child's port is its own while the child's
// process group holds its listening socket, and another process's when
// another holds it (one took the port while the child was down).
func TestListenerInGroup(t *testing.T) {
	addr, err := FreeAddr(t.Context(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	child, err := Start(Spec{Path: "/usr/bin/python3", Args: []string{"-c", `import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
time.sleep(60)`, port}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Kill() })
	var got GroupListener
	deadline := time.Now().Add(10 * time.Second)
	for got = ListenerInGroup(addr, child.Pid()); got.Inode == 0 && time.Now().Before(deadline); got = ListenerInGroup(addr, child.Pid()) {
		time.Sleep(10 * time.Millisecond)
	}
	if got.Inode == 0 || !got.InGroup {
		t.Fatalf("the child's own listener: %+v; want its group's", got)
	}
	if other := ListenerInGroup(addr, os.Getpid()); other.InGroup || other.Other.PID != child.Pid() {
		t.Fatalf("the child's listener asked as this process's group: %+v; want the child named as another's", other)
	}
	_ = child.Kill() // its error is the signal that ended it
	<-child.Done()
	// The child is gone; this process takes its port.
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	squat := ListenerInGroup(addr, child.Pid())
	if squat.InGroup || squat.Inode == got.Inode || squat.Other.PID != os.Getpid() {
		t.Fatalf("another process on the child's port: %+v; want this process (%d) named, not the child's group", squat, os.Getpid())
	}
	if none := ListenerInGroup("127.0.0.1:1", child.Pid()); none != (GroupListener{}) {
		t.Fatalf("nothing listening: %+v", none)
	}
}
