package agent

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
)

// TestAReplicaIsProbedAndConfiguredOnlyOnItsOwnPort: while a replica's
// process does not listen on its port (crashing, loading), another
// process that does is neither probed as the replica nor sent its
// user_config and reconfigure token (issue 58, M4: a replica listening on
// a crash-looping replica's port was called healthy, took its config,
// secret and requests); once the replica's own process listens there, it
// is.
func TestAReplicaIsProbedAndConfiguredOnlyOnItsOwnPort(t *testing.T) {
	a := testAgent(t)
	ctx := context.Background()
	var posted atomic.Int32
	squatter := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posted.Add(1)
		}
	})}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = squatter.Serve(l) }()
	t.Cleanup(func() { _ = squatter.Close() })
	port := l.Addr().(*net.TCPAddr).Port

	// The replica's process runs, and does not listen.
	child, err := proc.Start(proc.Spec{Path: "/bin/sleep", Args: []string{"60"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Kill() })
	r := a.newReplica("b", "b#000001", meshspec.ProcessSpec{HealthPath: "/", ReconfigurePath: "/config"}, false, port)
	id := child.Identity()
	r.process.Store(&id)
	r.setConfig(meshspec.UserConfig(`{"threshold": 1}`))
	status, output := r.readiness(ctx)
	if status != api.HealthCritical || !strings.Contains(output, "not by the replica's process") {
		t.Fatalf("probed on another process's port: %s %q; want critical, naming that the port is not the replica's", status, output)
	}
	if err := r.reconfigure(ctx); err == nil || posted.Load() != 0 {
		t.Fatalf("configured on another process's port: %v, %d POSTs; want no config sent", err, posted.Load())
	}

	// The replica's own process serves its port: it is probed and sent
	// its config (the positive control).
	_ = squatter.Close()
	out := &testutil.SyncBuffer{}
	server, err := proc.Start(proc.Spec{Path: "/usr/bin/python3", Args: []string{"-c", `import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        print("posted", self.headers.get("x-servemesh-reconfigure-token") is not None, flush=True)
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()`, strconv.Itoa(port)}, Stdout: out, Stderr: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Kill() })
	id = server.Identity()
	r.process.Store(&id)
	testutil.WaitFor(t, 10*time.Second, "the replica's own process to serve its port and be probed", func() bool {
		status, _ := r.readiness(ctx)
		return status == api.HealthPassing
	})
	// It printed before answering; its output reaches us through a pipe.
	testutil.WaitFor(t, 10*time.Second, "the replica's own process to say it took the config, with its token", func() bool {
		return strings.Contains(out.String(), "posted True")
	})
	if posted.Load() != 0 {
		t.Fatalf("the config went to the squatter %d times; want none", posted.Load())
	}
}
