//go:build e2e

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// testCA issues certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "servemesh test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue writes a leaf for 127.0.0.1 with serial into dir's cert.pem and
// key.pem, each replaced by rename, as a rotation does.
func (ca *testCA) issue(t *testing.T, dir string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "servemesh public"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{"key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER}, "cert.pem": {Type: "CERTIFICATE", Bytes: der}} {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPublicHTTPS serves the public listener over TLS with a certificate
// from files, HTTP/2 and HTTP/1.1 by ALPN, and picks up a new certificate
// when the files are replaced, without restarting Envoy.
func TestPublicHTTPS(t *testing.T) {
	t.Parallel()
	replicas := startReplicas(t, "v1", 1)
	config := filepath.Join(t.TempDir(), "mesh.yaml")
	writeModel(t, config, &meshspec.Model{Backends: []meshspec.Backend{replicas.backendModel()},
		Endpoints: []meshspec.Endpoint{{Name: "svc", Route: "/svc", Traffic: map[string]float64{"v1": 1}}}})
	cp := startControlPlane(t, config)
	ca := newTestCA(t)
	certs := t.TempDir()
	ca.issue(t, certs, 100)
	public, mesh := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := envoy.Launcher{Binary: envoyBin, WorkDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		PublicCert: filepath.Join(certs, "cert.pem"), PublicKey: filepath.Join(certs, "key.pem"),
		Bootstrap: bootstrap.Options{Node: wire.ProxyNode{ID: "https-node", PublicAddress: "127.0.0.1", PublicPort: testutil.Port(public),
			MeshAddress: "127.0.0.1", MeshPort: testutil.Port(mesh)}, XDSAddress: cp.xdsAddr}}.StartReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background(), 0) })

	get := func(h2 bool) (proto string, serial int64, err error) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}, DisableKeepAlives: true, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+public+"/svc", nil)
		resp, err := client.Do(req)
		if err != nil {
			return "", 0, err
		}
		defer func() { _ = resp.Body.Close() }()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return resp.Proto, 0, fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return resp.Proto, resp.TLS.PeerCertificates[0].SerialNumber.Int64(), nil
	}
	testutil.WaitFor(t, 20*time.Second, "HTTPS on the public listener", func() bool { _, _, err := get(true); return err == nil })
	if proto, serial, err := get(true); err != nil || proto != "HTTP/2.0" || serial != 100 {
		t.Fatalf("HTTP/2 over TLS: %s, certificate %d, %v", proto, serial, err)
	}
	if proto, _, err := get(false); err != nil || proto != "HTTP/1.1" {
		t.Fatalf("HTTP/1.1 over TLS: %s, %v", proto, err)
	}
	if resp, err := http.Get("http://" + public + "/svc"); err == nil { //nolint:noctx // test
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plaintext HTTP was served on the HTTPS listener")
		}
	}
	pid := p.Pid()
	ca.issue(t, certs, 200) // rotation: new files moved into place
	testutil.WaitFor(t, 20*time.Second, "the new certificate to be served", func() bool {
		_, serial, err := get(true)
		return err == nil && serial == 200
	})
	if p.Pid() != pid {
		t.Fatal("Envoy was restarted to pick up the certificate")
	}
}
