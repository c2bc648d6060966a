package connect

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/backoff"
	"github.com/servemesh/servemesh/internal/consulwatch"
	"github.com/servemesh/servemesh/wire"
)

// ControllerService is the service name of the controllers' identity.
const ControllerService = wire.ControllerService

// nodePrefix prefixes a node's identity service name.
const nodePrefix = wire.NodeServicePrefix

// Bundle is one identity: its leaf and the roots that verify its peers.
type Bundle struct {
	CertPEM, KeyPEM, RootsPEM []byte
	Leaf                      tls.Certificate
	Roots                     *x509.CertPool
}

// Fetch gets service's leaf and the CA's roots from the Consul agent.
func Fetch(ctx context.Context, client *api.Client, service string) (*Bundle, error) {
	cert, key, _, err := Leaf(ctx, client, service, 0)
	if err != nil {
		return nil, err
	}
	roots, _, err := Roots(ctx, client, 0)
	if err != nil {
		return nil, err
	}
	return newBundle(service, cert, key, roots)
}

// newBundle parses a leaf and the roots into a Bundle.
func newBundle(service string, cert, key, roots []byte) (*Bundle, error) {
	b := &Bundle{CertPEM: cert, KeyPEM: key, RootsPEM: roots, Roots: x509.NewCertPool()}
	if !b.Roots.AppendCertsFromPEM(b.RootsPEM) {
		return nil, errors.New("connect: the CA answered no usable root")
	}
	var err error
	if b.Leaf, err = tls.X509KeyPair(b.CertPEM, b.KeyPEM); err != nil {
		return nil, fmt.Errorf("connect: leaf certificate for %s: %w", service, err)
	}
	return b, nil
}

// Leaf gets service's leaf certificate and key (PEM). With index > 0 it is
// a blocking query: it answers when the leaf differs from the one of that
// index (Consul renews leaves before they expire and when roots rotate), or
// after a few minutes; the answer's index is returned for the next call.
func Leaf(ctx context.Context, client *api.Client, service string, index uint64) (cert, key []byte, next uint64, err error) {
	q := &api.QueryOptions{WaitIndex: index, WaitTime: blockFor}
	leaf, meta, err := client.Agent().ConnectCALeaf(service, q.WithContext(ctx))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("connect: leaf certificate for %s: %w", service, err)
	}
	return []byte(leaf.CertPEM), []byte(leaf.PrivateKeyPEM), meta.LastIndex, nil
}

// Roots gets the CA's roots (PEM, every root the CA still trusts, so
// peers with leaves of an older root stay verified while a rotation
// completes); index makes it a blocking query, as in Leaf.
func Roots(ctx context.Context, client *api.Client, index uint64) ([]byte, uint64, error) {
	q := &api.QueryOptions{WaitIndex: index, WaitTime: blockFor}
	roots, meta, err := client.Agent().ConnectCARoots(q.WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("connect: CA roots: %w", err)
	}
	var pem []byte
	for _, r := range roots.Roots {
		pem = append(pem, []byte(r.RootCertPEM)...)
		if !strings.HasSuffix(r.RootCertPEM, "\n") {
			pem = append(pem, '\n')
		}
	}
	if len(pem) == 0 {
		return nil, 0, errors.New("connect: the CA answered no root")
	}
	return pem, meta.LastIndex, nil
}

// blockFor bounds a blocking query.
const blockFor = 5 * time.Minute

// IdentityPrefix is the SPIFFE id of cert without its service name
// ("spiffe://<trust domain>/ns/default/dc/<dc>/svc/"): the same for every
// service of the datacenter.
func IdentityPrefix(cert *x509.Certificate) (string, bool) {
	for _, u := range cert.URIs {
		if _, ok := serviceOfURI(u); ok {
			s := u.String()
			return s[:strings.Index(s, "/svc/")+len("/svc/")], true
		}
	}
	return "", false
}

// Source keeps a service's bundle fresh with blocking queries on its leaf
// and on the roots: a renewed leaf or a rotated root is in use as soon as
// Consul has it.
type Source struct {
	client  *api.Client
	service string
	mu      sync.Mutex
	bundle  *Bundle
}

// NewSource fetches service's bundle once; Run keeps it fresh.
func NewSource(ctx context.Context, client *api.Client, service string) (*Source, error) {
	b, err := Fetch(ctx, client, service)
	if err != nil {
		return nil, err
	}
	return &Source{client: client, service: service, bundle: b}, nil
}

// Bundle is the current bundle.
func (s *Source) Bundle() *Bundle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bundle
}

// Run follows the leaf and the roots until ctx ends. A failed query keeps
// the last bundle, is logged and retried.
func (s *Source) Run(ctx context.Context, log *slog.Logger) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = consulwatch.Loop(ctx, log, "leaf of "+s.service, func(ctx context.Context, index uint64) (uint64, error) {
			cert, key, next, err := Leaf(ctx, s.client, s.service, index)
			if err == nil {
				err = s.update(func(b *Bundle) { b.CertPEM, b.KeyPEM = cert, key })
			}
			return next, err
		})
	}()
	go func() {
		defer wg.Done()
		_ = consulwatch.Loop(ctx, log, "CA roots", func(ctx context.Context, index uint64) (uint64, error) {
			roots, next, err := Roots(ctx, s.client, index)
			if err == nil {
				err = s.update(func(b *Bundle) { b.RootsPEM = roots })
			}
			return next, err
		})
	}()
	wg.Wait()
	return nil
}

// update replaces the bundle by a copy that change modified, if it parses.
func (s *Source) update(change func(*Bundle)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := *s.bundle
	change(&next)
	b, err := newBundle(s.service, next.CertPEM, next.KeyPEM, next.RootsPEM)
	if err != nil {
		return err
	}
	s.bundle = b
	return nil
}

// Retry calls fetch until it succeeds or ctx ends, logging each failure and
// pausing between tries (backoff.Consul): a Consul that is not up yet, or
// briefly away, delays a daemon's start instead of ending it. It returns
// fetch's last error when ctx ends first.
func Retry(ctx context.Context, log *slog.Logger, what string, fetch func(context.Context) error) error {
	return backoff.Retry(ctx, backoff.Consul(), fetch, func(err error, pause time.Duration) {
		log.Warn("getting a Consul Connect certificate failed; retrying (is Consul up, and Connect on?)", "what", what, "err", err, "retry_in", pause)
	})
}

// ServerTLS is the xDS server's TLS: its current leaf, and every client
// must present a certificate the current roots verify.
func (s *Source) ServerTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		b := s.Bundle()
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{b.Leaf}, ClientCAs: b.Roots,
			ClientAuth: tls.RequireAndVerifyClientCert, NextProtos: []string{"h2"}}, nil
	}}
}

// ServiceOf returns the service name of a SPIFFE id in cert's URI SANs.
func ServiceOf(cert *x509.Certificate) (string, bool) {
	for _, u := range cert.URIs {
		if s, ok := serviceOfURI(u); ok {
			return s, true
		}
	}
	return "", false
}

func serviceOfURI(u *url.URL) (string, bool) {
	if u.Scheme != "spiffe" {
		return "", false
	}
	_, svc, ok := strings.Cut(u.Path, "/svc/")
	return svc, ok && svc != ""
}

// NodeOf returns the node id a node's certificate names, if it is one of
// the mesh's: its SPIFFE id must be identityPrefix (the mesh's trust domain
// and datacenter, IdentityPrefix) followed by NodeService(id), exactly.
func NodeOf(cert *x509.Certificate, identityPrefix string) (string, bool) {
	for _, u := range cert.URIs {
		id, ok := strings.CutPrefix(u.String(), identityPrefix+nodePrefix)
		if ok && wire.CheckNodeID(id) == nil {
			return id, true
		}
	}
	return "", false
}

// IdentityPrefixOfPEM is IdentityPrefix of the first certificate in a PEM
// bundle, such as a leaf Consul issued.
func IdentityPrefixOfPEM(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "", errors.New("connect: no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	prefix, ok := IdentityPrefix(cert)
	if !ok {
		return "", errors.New("connect: the certificate names no SPIFFE service id")
	}
	return prefix, nil
}
