package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

func (c *Cluster) etcdCAFile() string { return c.etcdPKI.CAFile }

// etcdAuthPositiveControl proves the refusals above are about the missing
// certificate: the same client with the run's client certificate reads
// the key. It also checks the key material is readable only by its owner.
func etcdAuthPositiveControl(ctx context.Context, t *testing.T, host string, pool *x509.CertPool, key string) {
	t.Helper()
	p := shared.etcdPKI
	cert, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	n, err := etcdGet(ctx, "https://"+host, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, key)
	if err != nil || n != 1 {
		t.Fatalf("etcd client with the run's client certificate: %d keys, %v; want 1 key", n, err)
	}
	for f, want := range map[string]os.FileMode{p.dir: 0o700, p.ServerKey: 0o600, p.ClientKey: 0o600} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Errorf("etcd credentials: %v", err)
		} else if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v; want %v", filepath.Base(f), fi.Mode().Perm(), want)
		}
	}
}
