package httpserver

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// CertFiles serves a certificate from PEM files and reloads it when either
// file changes (checked at most once a second, on new connections): replace
// them by rename, and new connections get the new certificate; no restart.
type CertFiles struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string // the files' sizes and times when cert was loaded
	checked time.Time
}

// LoadCertFiles loads the certificate chain and key; an unreadable or
// mismatched pair is an error naming the files.
func LoadCertFiles(certFile, keyFile string) (*CertFiles, error) {
	c := &CertFiles{certFile: certFile, keyFile: keyFile}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

// TLSConfig is a server configuration that serves the current certificate.
func (c *CertFiles) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return c.current(), nil
	}}
}

// current returns the certificate, reloaded if the files changed; a pair
// that does not load (say, half replaced) keeps the last good one.
func (c *CertFiles) current() *tls.Certificate {
	c.mu.Lock()
	due := time.Since(c.checked) >= time.Second
	if due {
		c.checked = time.Now()
	}
	stale := due && c.stampNow() != c.stamp
	c.mu.Unlock()
	if stale {
		_ = c.load()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert
}

func (c *CertFiles) load() error {
	stamp := c.stampNow()
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.mu.Lock()
	c.cert, c.stamp = &cert, stamp
	c.mu.Unlock()
	return nil
}

func (c *CertFiles) stampNow() string {
	stamp := ""
	for _, f := range []string{c.certFile, c.keyFile} {
		if st, err := os.Stat(f); err == nil {
			stamp += fmt.Sprintf("%d/%d;", st.Size(), st.ModTime().UnixNano())
		}
	}
	return stamp
}
