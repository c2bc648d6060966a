// Package connect gets servemesh's identities from Consul's service-mesh
// CA (Connect): a leaf certificate for a service name, whose URI SAN is a
// SPIFFE id (spiffe://<trust domain>/ns/default/dc/<dc>/svc/<service>), and
// the CA's roots. The controller serves xDS with its leaf
// (ControllerService) and trusts the roots; a node's Envoy presents the
// leaf of NodeService(id), which is how the xDS server knows which node a
// stream belongs to. servemesh issues no certificate of its own.
package connect

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/wire"
)

// ControllerService is the service name of the controllers' identity.
const ControllerService = "servemesh-controller"

// nodePrefix prefixes a node's identity service name.
const nodePrefix = wire.NodeServicePrefix

// NodeService is the service name of node id's identity.
func NodeService(id string) string { return nodePrefix + id }

// Bundle is one identity: its leaf and the roots that verify its peers.
type Bundle struct {
	CertPEM, KeyPEM, RootsPEM []byte
	Leaf                      tls.Certificate
	Roots                     *x509.CertPool
}

// Fetch gets service's leaf and the CA's roots from the Consul agent.
func Fetch(ctx context.Context, client *api.Client, service string) (*Bundle, error) {
	leaf, _, err := client.Agent().ConnectCALeaf(service, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("connect: leaf certificate for %s: %w", service, err)
	}
	roots, _, err := client.Agent().ConnectCARoots((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("connect: CA roots: %w", err)
	}
	b := &Bundle{CertPEM: []byte(leaf.CertPEM), KeyPEM: []byte(leaf.PrivateKeyPEM), Roots: x509.NewCertPool()}
	for _, r := range roots.Roots {
		b.RootsPEM = append(b.RootsPEM, []byte(r.RootCertPEM)...)
		if !strings.HasSuffix(r.RootCertPEM, "\n") {
			b.RootsPEM = append(b.RootsPEM, '\n')
		}
	}
	if !b.Roots.AppendCertsFromPEM(b.RootsPEM) {
		return nil, errors.New("connect: the CA answered no usable root")
	}
	if b.Leaf, err = tls.X509KeyPair(b.CertPEM, b.KeyPEM); err != nil {
		return nil, fmt.Errorf("connect: leaf certificate for %s: %w", service, err)
	}
	return b, nil
}

// Source keeps a service's bundle fresh: it fetches it again every Refresh
// (Consul renews leaves well before they expire, and rotates roots).
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

// Run fetches the bundle every refresh until ctx ends; onChange, if not
// nil, sees each new one. A failed fetch keeps the last bundle.
func (s *Source) Run(ctx context.Context, refresh time.Duration, onChange func(*Bundle)) {
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		b, err := Fetch(ctx, s.client, s.service)
		if err != nil {
			continue
		}
		s.mu.Lock()
		changed := string(b.CertPEM) != string(s.bundle.CertPEM) || string(b.RootsPEM) != string(s.bundle.RootsPEM)
		s.bundle = b
		s.mu.Unlock()
		if changed && onChange != nil {
			onChange(b)
		}
	}
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

// NodeOf returns the node id a node's certificate names, if it is one.
func NodeOf(cert *x509.Certificate) (string, bool) {
	svc, ok := ServiceOf(cert)
	if !ok || !strings.HasPrefix(svc, nodePrefix) {
		return "", false
	}
	return strings.TrimPrefix(svc, nodePrefix), true
}
