package localcluster

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// The in-process kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app/testing)
// signs and verifies service-account tokens with one fixed, publicly known
// ECDSA P-256 test key; callers cannot choose another (it overrides the
// --service-account-* flags). A kube-controller-manager next to it signs
// the legacy token Secrets with --service-account-private-key-file, which
// must be that key for the API server to accept those tokens.
// serviceAccountKeyPEM is that key, as Kubernetes v1.36's test server
// writes it; WriteServiceAccountKey checks it against the API server's
// published keys, so a Kubernetes upgrade that changes it is an error, not
// a silent mismatch. It is insecure by design: a local cluster only.
const serviceAccountKeyPEM = `-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIEZmTmUhuanLjPA2CLquXivuwBDHTt5XYwgIr/kA1LtRoAoGCCqGSM49
AwEHoUQDQgAEH6cuzP8XuD5wal6wf9M6xDljTOPLX2i8uIp/C/ASqiIGUeeKQtX0
/IR3qCXyThP/dbCiHrF3v1cuhBOHY8CLVg==
-----END EC PRIVATE KEY-----
`

// WriteServiceAccountKey writes the API server's service-account signing
// key (PEM) to path, after checking that the running API server publishes
// its public half in /openid/v1/jwks.
func (c *Cluster) WriteServiceAccountKey(ctx context.Context, path string) error {
	block, _ := pem.Decode([]byte(serviceAccountKeyPEM))
	if block == nil {
		return errors.New("service-account key: no PEM block")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	published, err := c.publishedKeys(ctx)
	if err != nil {
		return err
	}
	if !containsKey(published, &key.PublicKey) {
		return fmt.Errorf("service-account key: the API server at %s does not publish the key localcluster knows (%d keys in /openid/v1/jwks): its test server's signing key changed", c.Host(), len(published))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write service-account key %s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(serviceAccountKeyPEM), 0o600); err != nil {
		return fmt.Errorf("write service-account key %s: %w", path, err)
	}
	return nil
}

// WriteCA writes the CA certificate (PEM) clients of the API server trust
// to path: kube-controller-manager's --root-ca-file, which it publishes in
// every namespace's kube-root-ca.crt ConfigMap.
func (c *Cluster) WriteCA(path string) error {
	if len(c.caData) == 0 {
		return errors.New("write CA: the API server's CA is not known yet")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write CA %s: %w", path, err)
	}
	if err := os.WriteFile(path, c.caData, 0o600); err != nil {
		return fmt.Errorf("write CA %s: %w", path, err)
	}
	return nil
}

// jwk is the part of a JSON Web Key an EC public key needs.
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// publishedKeys reads the API server's service-account issuer keys.
func (c *Cluster) publishedKeys(ctx context.Context) ([]jwk, error) {
	raw, err := c.Client().CoreV1().RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's service-account keys (/openid/v1/jwks): %w", err)
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(raw, &set); err != nil {
		return nil, fmt.Errorf("read the API server's service-account keys (/openid/v1/jwks): %w", err)
	}
	return set.Keys, nil
}

func containsKey(keys []jwk, pub *ecdsa.PublicKey) bool {
	point, err := pub.ECDH() // uncompressed: 0x04 || X || Y
	if err != nil {
		return false
	}
	want := point.Bytes()
	for _, k := range keys {
		if k.Kty != "EC" || k.Crv != "P-256" {
			continue
		}
		x, errX := base64.RawURLEncoding.DecodeString(k.X)
		y, errY := base64.RawURLEncoding.DecodeString(k.Y)
		if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
			continue
		}
		if bytes.Equal(want, append(append([]byte{4}, x...), y...)) {
			return true
		}
	}
	return false
}
