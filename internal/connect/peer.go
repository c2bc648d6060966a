package connect

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
)

// This file is TLS between two servemesh daemons that know each other by
// their Connect identities (the controller calling a node's agent), as
// opposed to Envoy's, which the xds packages configure.

// Identity is the SPIFFE id of service in the trust domain and datacenter
// of this source's leaf.
func (s *Source) Identity(service string) string {
	prefix, _ := IdentityPrefix(s.Bundle().Leaf.Leaf)
	return prefix + service
}

// ServerTLSForPeers is TLS for a listener that tells its callers apart by
// their identity: it presents the current leaf and verifies a client
// certificate, when one is given, against the current roots. A handler
// reads who called with PeerIs; a caller without a certificate is
// anonymous.
func (s *Source) ServerTLSForPeers() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		b := s.Bundle()
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{b.Leaf}, ClientCAs: b.Roots,
			ClientAuth: tls.VerifyClientCertIfGiven, NextProtos: []string{"h2", "http/1.1"}}, nil
	}}
}

// PeerIs reports whether the client of state presented a certificate the
// roots verified whose SPIFFE id is exactly id.
func PeerIs(state *tls.ConnectionState, id string) bool {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return false
	}
	return hasURI(state.VerifiedChains[0][0], id)
}

// ClientTLS is TLS for calling a server that must be service: it presents
// the current leaf, and takes only a server certificate that the current
// roots verify and whose SPIFFE id is exactly Identity(service). Connect's
// certificates name a SPIFFE id and no host, so the host name is not
// what is checked.
func (s *Source) ClientTLS(service string) *tls.Config {
	want := s.Identity(service)
	return &tls.Config{MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection checks the chain and the SPIFFE id instead of a host name
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			leaf := s.Bundle().Leaf
			return &leaf, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("connect: the server presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: s.Bundle().Roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("connect: the server's certificate: %w", err)
			}
			if !hasURI(cs.PeerCertificates[0], want) {
				return fmt.Errorf("connect: the server is not %s (its certificate names %v)", want, cs.PeerCertificates[0].URIs)
			}
			return nil
		},
	}
}

func hasURI(cert *x509.Certificate, id string) bool {
	return slices.ContainsFunc(cert.URIs, func(u *url.URL) bool { return u.String() == id })
}
