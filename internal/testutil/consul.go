package testutil

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servemesh/servemesh/dev/devconsul"
)

// Consul is a real Consul dev agent (see package devconsul).
type Consul = devconsul.Agent

// StartConsul starts a dev agent on free loopback ports, logging into dir.
// It fails rather than skips when Consul is missing.
func StartConsul(dir string) (*Consul, error) { return devconsul.Start(dir, 0) }

// MustStartConsul starts a dev agent for one test, logging into a folder of
// the test's, and stops it when the test ends. The test fails, never skips,
// when Consul is missing.
func MustStartConsul(t testing.TB) *Consul {
	t.Helper()
	c, err := devconsul.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatalf("the real Consul is required (`make tools` installs it): %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartConsulLater starts a dev agent for one test after delay, reached at
// the HTTP address it returns at once (for daemons started before Consul),
// and stops it when the test ends. A missing Consul fails the test at
// once, not after whatever the test waits for.
//
// The address is the test's from the start: it holds the port, closing
// each connection until Consul is up, then passes connections on to
// Consul's own (a port chosen free and left for Consul to bind was taken
// by another test meanwhile).
func StartConsulLater(t testing.TB, delay time.Duration) string {
	t.Helper()
	if _, err := devconsul.Find(); err != nil {
		t.Fatalf("the real Consul is required (`make tools` installs it): %v", err)
	}
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var target atomic.Pointer[string]
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go forward(c, target.Load())
		}
	}()
	later := make(chan *Consul, 1)
	dir := t.TempDir()
	go func() {
		time.Sleep(delay)
		c, err := devconsul.StartWith(dir, devconsul.Options{})
		if err != nil {
			t.Errorf("the real Consul is required (`make tools` installs it): %v", err)
		} else {
			target.Store(&c.HTTPAddr)
		}
		later <- c
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		if c := <-later; c != nil {
			c.Stop()
		}
	})
	return lis.Addr().String()
}

// forward passes c on to the address to, both ways, or closes it when
// there is none yet.
func forward(c net.Conn, to *string) {
	defer func() { _ = c.Close() }()
	if to == nil {
		return
	}
	up, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "tcp", *to)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
