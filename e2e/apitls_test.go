//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"github.com/servemesh/servemesh/internal/testutil"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAPIOverHTTPS serves the controller's API over HTTPS with a
// certificate from files: the CLI verifies it with --ca-file, refuses an
// unknown CA, plain HTTP gets no answer, and replacing the files by rename
// serves the new certificate without a restart.
func TestAPIOverHTTPS(t *testing.T) {
	t.Parallel()
	consul := startConsul(t)
	ca, dir := newTestCA(t), t.TempDir()
	ca.issue(t, dir, 300)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := startController(t, consul, "ctl", []string{"--api-tls-cert", filepath.Join(dir, "cert.pem"), "--api-tls-key", filepath.Join(dir, "key.pem")})
	ctl.waitServingTLS(t, caFile) // the CLI verifies the certificate with --ca-file
	if code, _, errOut := cli(t, nil, "status", "--server", "https://"+ctl.apiAddr, "--failover-wait", "0"); code == 0 || !strings.Contains(errOut, "certificate") {
		t.Fatalf("status over HTTPS without the CA: exit %d, %q; want a certificate error", code, errOut)
	}
	if code, _, _ := cli(t, nil, "status", "--server", ctl.apiAddr, "--failover-wait", "0"); code == 0 {
		t.Fatal("plain HTTP to the HTTPS API was answered")
	}

	serial := func() int64 {
		d := &tls.Dialer{Config: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}}
		conn, err := d.DialContext(context.Background(), "tcp", ctl.apiAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(); got != 300 {
		t.Fatalf("serial %d, want 300", got)
	}
	ca.issue(t, dir, 301)
	testutil.WaitFor(t, 10*time.Second, "the API to serve the replaced certificate", func() bool { return serial() == 301 })
}
