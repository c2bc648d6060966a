package envoy

import (
	"fmt"
	"os"
	"path/filepath"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/servemesh/servemesh/internal/protoyaml"
)

// CertificateSecret renders a file-based SDS config holding secret name: a
// certificate chain and its key, inline, so that replacing the one file
// changes both at once.
func CertificateSecret(name string, certPEM, keyPEM []byte) ([]byte, error) {
	return sdsConfig(&tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(certPEM),
		PrivateKey:       inline(keyPEM),
	}}})
}

// RootsSecret renders a file-based SDS config holding secret name: the CA
// roots that verify peers.
func RootsSecret(name string, rootsPEM []byte) ([]byte, error) {
	return sdsConfig(&tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: inline(rootsPEM),
	}}})
}

func inline(b []byte) *core.DataSource {
	return &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: b}}
}

func sdsConfig(secret *tlsv3.Secret) ([]byte, error) {
	packed, err := anypb.New(secret)
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", secret.GetName(), err)
	}
	out, err := protoyaml.Marshal(&discovery.DiscoveryResponse{Resources: []*anypb.Any{packed}})
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", secret.GetName(), err)
	}
	return out, nil
}

// ReplaceFile replaces the file at path by data, readable by its owner
// only, with a rename in its folder: a reader (Envoy watching a secret, the
// next agent reading a record) sees the old file or the new one, never
// half of one, even across a crash.
func ReplaceFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".replace-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
