// Package devredis runs a real Redis server (Debian's redis-server) on a
// loopback port, with a password and nothing saved to disk: the store of
// the global rate limits' services in the demo stack and the tests. Like
// devconsul, it fails rather than skips when Redis is missing.
package devredis

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/toolpath"
)

// Server is a running redis-server.
type Server struct {
	// Addr is where it listens, 127.0.0.1:port; Password is its AUTH
	// password.
	Addr, Password string
	child          *proc.Process
	log            string
}

// Find returns redis-server: $SERVEMESH_REDIS, else .tools/bin or $PATH
// (make tools installs Debian's).
func Find() (string, error) { return toolpath.Find("redis-server", "SERVEMESH_REDIS", "") }

// Start starts a server logging into dir, on port (a free one when 0),
// asking for password, and waits until it answers.
func Start(dir string, port int, password string) (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, fmt.Errorf("the real Redis is required (`make tools` installs Debian's redis-server): %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if port == 0 {
		if addr, err = proc.FreeAddr(context.Background(), "127.0.0.1"); err != nil {
			return nil, err
		}
	}
	_, p, _ := net.SplitHostPort(addr)
	s := &Server{Addr: addr, Password: password, log: filepath.Join(dir, "redis.log")}
	logFile, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	// The password in a file of this user's alone, never on the command
	// line, where every user of the machine could read it.
	conf := fmt.Sprintf("bind 127.0.0.1\nport %s\nsave \"\"\nappendonly no\ndir %s\nrequirepass %q\n", p, dir, password)
	conf += "protected-mode yes\n"
	confPath := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	if s.child, err = proc.Start(proc.Spec{Path: bin, Args: []string{confPath}, Stdout: logFile, Stderr: logFile}); err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := s.Ping(context.Background()); err == nil {
			return s, nil
		} else if time.Now().After(deadline) || s.child.Exited() {
			s.Stop()
			return nil, fmt.Errorf("redis-server at %s did not answer within 10s: %w; log:\n%s", addr, err, proc.LogTail(s.log, 2048))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Ping authenticates and pings the server (RESP, inline commands).
func (s *Server) Ping(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.Addr)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(conn)
	for _, cmd := range [][]string{{"AUTH", s.Password}, {"PING"}} {
		if _, err := conn.Write(resp(cmd)); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "+") {
			return fmt.Errorf("redis: %s", strings.TrimSpace(line))
		}
	}
	return nil
}

// resp encodes a command as a RESP array of bulk strings.
func resp(args []string) []byte {
	b := fmt.Appendf(nil, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

// Stop stops the server.
func (s *Server) Stop() {
	if s.child != nil {
		_ = s.child.Stop(5 * time.Second)
	}
}

// Kill kills the server at once, as a crash would.
func (s *Server) Kill() {
	if s.child != nil {
		_ = s.child.Kill()
		_ = s.child.Wait()
	}
}
