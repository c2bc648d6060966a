package secrets

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/protoyaml"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/wire"
)

// readSecret reads a file-based SDS config back as Envoy would.
func readSecret(t *testing.T, dir, name string) *tlsv3.Secret {
	t.Helper()
	b, err := os.ReadFile(wire.SecretFile(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	var resp discovery.DiscoveryResponse
	if err := protoyaml.Unmarshal(b, &resp); err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("secret %s does not read back as one resource: %v", name, err)
	}
	var s tlsv3.Secret
	if err := resp.GetResources()[0].UnmarshalTo(&s); err != nil {
		t.Fatal(err)
	}
	if s.GetName() != name {
		t.Fatalf("secret file %s holds secret %q", name, s.GetName())
	}
	return &s
}

// TestSecretsFromConsul writes the node's identity, the roots and a
// backend's identity from the real Consul's CA, as Envoy reads them, in a
// folder only the agent can read.
func TestSecretsFromConsul(t *testing.T) {
	consul := testutil.MustStartConsul(t)
	client, err := consul.Client()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "work", "secrets") // the node's work folder does not exist yet
	s := New(dir, client, "n1", slog.New(slog.DiscardHandler))
	if err := s.AddBackend(context.Background(), "web"); err == nil {
		t.Fatal("a backend's identity was written before the secrets started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.AddBackend(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("secrets folder mode %v, %v; want 0700", st.Mode().Perm(), err)
	}
	// The work folder it made is the node's, which replicas (other users)
	// pass through to their own folders: it was made 0700 too, and every
	// replica then failed to start.
	if st, err := os.Stat(filepath.Dir(dir)); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("work folder mode %v, %v; want 0755", st.Mode().Perm(), err)
	}
	for name, want := range map[string]string{wire.NodeSecret: wire.NodeService("n1"), wire.BackendSecret("web"): wire.BackendService("web")} {
		c := readSecret(t, dir, name).GetTlsCertificate()
		pair, err := tls.X509KeyPair(c.GetCertificateChain().GetInlineBytes(), c.GetPrivateKey().GetInlineBytes())
		if err != nil {
			t.Fatalf("secret %s: %v", name, err)
		}
		if svc, ok := connect.ServiceOf(pair.Leaf); !ok || svc != want {
			t.Errorf("secret %s names service %q, want %q", name, svc, want)
		}
	}
	if roots := readSecret(t, dir, wire.RootsSecret).GetValidationContext().GetTrustedCa().GetInlineBytes(); len(roots) == 0 {
		t.Fatal("the roots secret holds no root")
	}
	s.RemoveBackend("web")
	if _, err := os.Stat(wire.SecretFile(dir, wire.BackendSecret("web"))); !os.IsNotExist(err) || len(s.Backends()) != 0 {
		t.Fatalf("a removed backend's identity is still there: %v, %v", err, s.Backends())
	}
	if err := s.AddBackend(ctx, "web"); err != nil { // it comes back
		t.Fatal(err)
	}
	readSecret(t, dir, wire.BackendSecret("web"))
}

// TestSecretsWaitForConsul: an agent started before Consul answers waits
// for its identities instead of failing.
func TestSecretsWaitForConsul(t *testing.T) {
	addr := testutil.StartConsulLater(t, 2*time.Second)
	client, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := New(filepath.Join(t.TempDir(), "secrets"), client, "n1", slog.New(slog.DiscardHandler))
	if err := s.Start(ctx); err != nil {
		t.Fatalf("the secrets did not wait for Consul: %v", err)
	}
	readSecret(t, s.Dir(), wire.NodeSecret)
}
