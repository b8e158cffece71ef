package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// etcdPKI is the throwaway certificate authority that locks latch-local's
// etcd to the API server. etcd listens on loopback, where every user of
// the machine can connect; without authentication any of them could read
// every Secret stored in the cluster, admin token or not. So etcd demands
// a client certificate signed by a CA that exists only for this run: the
// CA's key is never written anywhere, and the server and client keys live
// in a 0700 directory of their own (files 0600), removed at Stop.
type etcdPKI struct {
	dir string
	// CAFile is the CA certificate both sides trust.
	CAFile string
	// ServerCert/ServerKey serve etcd's client and peer URLs; the peer
	// certificate is the same one, usable as a client too, since a peer
	// dials the others with it.
	ServerCert, ServerKey string
	// ClientCert/ClientKey are the API server's (and this package's tests')
	// credentials towards etcd.
	ClientCert, ClientKey string
}

// newEtcdPKI creates a fresh CA, a server certificate for 127.0.0.1 and
// localhost, and a client certificate, in a new 0700 directory.
func newEtcdPKI() (_ *etcdPKI, err error) {
	dir, err := os.MkdirTemp("", "latch-etcd-pki-") // 0700
	if err != nil {
		return nil, fmt.Errorf("create etcd certificate dir: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	p := &etcdPKI{
		dir:        dir,
		CAFile:     filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate etcd CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "latch-local etcd CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("sign etcd CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	leaf := func(cn string, usage []x509.ExtKeyUsage, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generate etcd %s key: %w", cn, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Minute),
			NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			DNSNames:     []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("sign etcd %s certificate: %w", cn, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(keyFile, "EC PRIVATE KEY", keyDER, 0o600); err != nil {
			return err
		}
		return writePEM(certFile, "CERTIFICATE", der, 0o644)
	}
	if err := leaf("latch-local-etcd", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, p.ServerCert, p.ServerKey); err != nil {
		return nil, err
	}
	if err := leaf("kube-apiserver-etcd-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, p.ClientCert, p.ClientKey); err != nil {
		return nil, err
	}
	return p, nil
}

// remove deletes the certificates and keys.
func (p *etcdPKI) remove() {
	if p != nil {
		os.RemoveAll(p.dir)
	}
}

// serial is a random 127-bit certificate serial number. crypto/rand.Read
// never returns an error since Go 1.24.
func serial() *big.Int {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b)
}

// writePEM creates path with mode (never wider: O_EXCL, so an existing
// file with other permissions is an error, not reused).
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
