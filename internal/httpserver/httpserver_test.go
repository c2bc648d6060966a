package httpserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func echo() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(append([]byte("ok "), b...))
	})
}

// closedWithin reports whether the server closes conn within d.
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			return !errors.As(err, &ne) || !ne.Timeout()
		}
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	var d net.Dialer
	conn, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestServesAndStops(t *testing.T) {
	s, err := Start(context.Background(), quiet(), "127.0.0.1:0", echo())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+s.Addr()+"/", "text/plain", strings.NewReader("x")) //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(b) != "ok x" {
		t.Fatalf("body %q", b)
	}
	s.Stop()
	if resp, err := http.Get("http://" + s.Addr() + "/"); err == nil { //nolint:noctx // test
		_ = resp.Body.Close()
		t.Fatal("still serving after Stop")
	}
}

// TestSlowAndIdleClientsAreCutOff: a request whose headers or body trickle
// in, and a keep-alive connection left idle, are closed by the limits (a
// body sent one byte every 2 s was still open after 30 s; idle keep-alives
// stayed open). The limits are shortened here; DefaultLimits has the
// documented ones.
func TestSlowAndIdleClientsAreCutOff(t *testing.T) {
	l := Limits{ReadHeader: 300 * time.Millisecond, Read: 600 * time.Millisecond, Write: time.Second,
		Idle: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10, MaxConnections: 8}
	s, err := StartLimited(context.Background(), quiet(), "127.0.0.1:0", echo(), l)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()

	headers := dial(t, s.Addr())
	_, _ = headers.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n"))
	if !closedWithin(headers, 5*time.Second) {
		t.Error("a request whose headers never end was kept open")
	}

	body := dial(t, s.Addr())
	_, _ = body.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"))
	go func() {
		for range 20 {
			if _, err := body.Write([]byte("a")); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	if !closedWithin(body, 5*time.Second) {
		t.Error("a request whose body trickles in was kept open")
	}

	idle := dial(t, s.Addr())
	_, _ = idle.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")) // one request, then nothing
	if !closedWithin(idle, 5*time.Second) {
		t.Error("an idle keep-alive connection was kept open")
	}

	big := dial(t, s.Addr())
	_, _ = big.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n"))
	_ = big.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, _ := io.ReadAll(big)
	if !strings.Contains(string(answer), "431") {
		t.Errorf("headers over the limit: %.60q, want 431", answer)
	}
}

// TestConnectionsAreCapped: past MaxConnections, a connection waits to be
// accepted until another closes.
func TestConnectionsAreCapped(t *testing.T) {
	l := DefaultLimits
	l.MaxConnections = 2
	s, err := StartLimited(context.Background(), quiet(), "127.0.0.1:0", echo(), l)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	first, second := dial(t, s.Addr()), dial(t, s.Addr())
	for _, c := range []net.Conn{first, second} {
		_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 512)); err != nil {
			t.Fatalf("a connection within the cap: %v", err)
		}
	}
	third := dial(t, s.Addr())
	_, _ = third.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := third.Read(make([]byte, 512)); err == nil {
		t.Fatal("a connection over the cap was served")
	}
	_ = first.Close()
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 512)); err != nil {
		t.Fatalf("the waiting connection was not served once another closed: %v", err)
	}
}

func TestRequireBearer(t *testing.T) {
	h := RequireBearer("s3cret", echo())
	for header, want := range map[string]int{"": 401, "Bearer nope": 401, "Bearer s3cret": 200, "bearer s3cret": 200, "Basic s3cret": 401} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "/v1/load", http.NoBody)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("Authorization %q: %d, want %d", header, w.Code, want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:0": true, "[::1]:9": true, "localhost:1": true, "0.0.0.0:9": false, "10.1.2.3:9": false, "bad": false} {
		if IsLoopback(addr) != want {
			t.Errorf("IsLoopback(%q) = %v", addr, !want)
		}
	}
}

// TestCertFilesNameTheFiles: a certificate that does not load is an error
// naming both files, so the operator knows which flag to fix.
func TestCertFilesNameTheFiles(t *testing.T) {
	dir := t.TempDir()
	cert, key := dir+"/cert.pem", dir+"/key.pem"
	if err := os.WriteFile(cert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadCertFiles(cert, key)
	if err == nil || !strings.Contains(err.Error(), cert) || !strings.Contains(err.Error(), key) {
		t.Fatalf("error %v, want one naming %s and %s", err, cert, key)
	}
}
