package httpserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"
)

// ListenTLSOrPlain is Listen for a server that takes both TLS (with cfg)
// and plain HTTP on one address, told apart by a connection's first byte
// (a TLS handshake's is 0x16, no HTTP method's). Handlers tell them apart
// by the request's TLS field. An agent's status listener serves the
// controller over mTLS and Prometheus's scrapes in plain HTTP so.
func ListenTLSOrPlain(ctx context.Context, addr string, h http.Handler, l Limits, cfg *tls.Config) (*Server, error) {
	var lc net.ListenConfig
	inner, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	lis := newSniffListener(netutil.LimitListener(inner, l.MaxConnections), cfg, l.ReadHeader)
	return &Server{lis: lis, addr: lis.Addr().String(), hs: &http.Server{
		Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write,
		IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes,
	}}, nil
}

// sniffListener accepts from inner and hands on each connection once its
// first byte has come, as a *tls.Conn (which http.Server serves as HTTPS)
// when it starts a TLS handshake. A connection is read in a goroutine of
// its own, within wait, so a client that sends nothing holds up no other.
type sniffListener struct {
	net.Listener
	cfg  *tls.Config
	wait time.Duration

	ready chan net.Conn
	done  chan struct{}
	once  sync.Once
	err   error // why inner stopped accepting; read once done is closed
}

func newSniffListener(inner net.Listener, cfg *tls.Config, wait time.Duration) *sniffListener {
	s := &sniffListener{Listener: inner, cfg: cfg, wait: wait, ready: make(chan net.Conn), done: make(chan struct{})}
	go s.acceptLoop()
	return s
}

func (s *sniffListener) acceptLoop() {
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			s.once.Do(func() { s.err = err; close(s.done) })
			return
		}
		go s.sniff(c)
	}
}

// sniff reads c's first byte and hands c on, or closes it.
func (s *sniffListener) sniff(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(s.wait))
	r := bufio.NewReaderSize(c, 1)
	first, err := r.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		_ = c.Close()
		return
	}
	var conn net.Conn = &peekedConn{Conn: c, r: r}
	if first[0] == 0x16 { // a TLS record of type handshake
		conn = tls.Server(conn, s.cfg)
	}
	select {
	case s.ready <- conn:
	case <-s.done:
		_ = c.Close()
	}
}

// Accept returns the next connection whose first byte has come.
func (s *sniffListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.ready:
		return c, nil
	case <-s.done:
		return nil, s.err
	}
}

// Close stops accepting; connections not yet handed on are closed.
func (s *sniffListener) Close() error {
	err := s.Listener.Close()
	s.once.Do(func() { s.err = net.ErrClosed; close(s.done) })
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// peekedConn reads what was peeked first.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
