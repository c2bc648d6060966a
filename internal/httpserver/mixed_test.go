package httpserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net/http"
	"testing"
	"time"
)

// TestTLSOrPlainServesBoth: one listener answers plain HTTP and TLS, each
// request knowing which it came over, and a client that sends nothing
// holds up no other.
func TestTLSOrPlainServesBoth(t *testing.T) {
	cert := selfSigned(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil {
			_, _ = io.WriteString(w, "tls")
			return
		}
		_, _ = io.WriteString(w, "plain")
	})
	ctx, cancel := context.WithCancel(t.Context())
	s, err := ListenTLSOrPlain(ctx, "127.0.0.1:0", h, DefaultLimits, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	silent := dial(t, s.Addr()) // sends nothing, and waits
	defer func() { _ = silent.Close() }()

	get := func(client *http.Client, url string) string {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get(&http.Client{Timeout: 5 * time.Second}, "http://"+s.Addr()+"/"); got != "plain" {
		t.Errorf("plain HTTP answered %q", got)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	tlsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "servemesh.test", MinVersion: tls.VersionTLS12}}}
	if got := get(tlsClient, "https://"+s.Addr()+"/"); got != "tls" {
		t.Errorf("HTTPS answered %q", got)
	}
}

// selfSigned is a certificate for servemesh.test.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"servemesh.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}
