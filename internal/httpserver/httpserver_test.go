package httpserver

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestServesAndStops(t *testing.T) {
	s, err := Start(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), "127.0.0.1:0",
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr() + "/") //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("body %q", b)
	}
	// A client that never finishes its request headers is cut off.
	var d net.Dialer
	conn, err := d.DialContext(context.Background(), "tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(ReadHeaderTimeout + 5*time.Second))
	start := time.Now()
	_, err = conn.Read(make([]byte, 1))
	for err == nil {
		_, err = conn.Read(make([]byte, 512))
	}
	if waited := time.Since(start); waited > ReadHeaderTimeout+3*time.Second {
		t.Fatalf("a stalled request was kept open %s", waited)
	}
	s.Stop()
	if resp, err := http.Get("http://" + s.Addr() + "/"); err == nil { //nolint:noctx // test
		_ = resp.Body.Close()
		t.Fatal("still serving after Stop")
	}
}
