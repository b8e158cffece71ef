package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// etcdGet reads key from the cluster's etcd with cfg's credentials.
func etcdGet(ctx context.Context, endpoint string, tlsCfg *tls.Config, key string) (int, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

// Anyone on the machine can connect to etcd's loopback port: without a
// client certificate from this run's CA, etcd must not answer, neither to
// a plain connection nor to TLS without a certificate, while the API
// server (which has one) keeps working.
func TestEtcdRefusesClientsWithoutTheRunsClientCertificate_apiserverStillWorks(t *testing.T) {
	ctx := testContext(t)
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "etcd-auth-probe"}, StringData: map[string]string{"password": "not-for-other-users"}}
	if _, err := shared.Client().CoreV1().Secrets("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server cannot write to etcd: %v", err)
	}
	t.Cleanup(func() {
		_ = shared.Client().CoreV1().Secrets("default").Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
	key := "/registry/secrets/default/etcd-auth-probe"
	u, err := url.Parse(shared.EtcdURL())
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host

	// Plain gRPC (what etcdctl does without --cacert/--cert).
	if n, err := etcdGet(ctx, "http://"+host, nil, key); err == nil {
		t.Errorf("plain etcd client read %s: %d keys; want the connection refused", key, n)
	}
	// Plain HTTP, the JSON gateway and /version.
	hc := &http.Client{Timeout: 3 * time.Second}
	for _, path := range []string{"/version", "/v3/kv/range"} {
		resp, err := hc.Post("http://"+host+path, "application/json", strings.NewReader(`{"key":"L3JlZ2lzdHJ5L3NlY3JldHMvZGVmYXVsdC9ldGNkLWF1dGgtcHJvYmU="}`))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("plain HTTP POST %s answered 200: %.200s", path, body)
			}
		}
	}
	// TLS that trusts the server but shows no certificate of its own.
	pool := x509.NewCertPool()
	if shared.etcdCAFile() != "" {
		ca, err := os.ReadFile(shared.etcdCAFile())
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(ca)
	}
	if n, err := etcdGet(ctx, "https://"+host, &tls.Config{RootCAs: pool}, key); err == nil {
		t.Errorf("etcd client without a client certificate read %s: %d keys; want the handshake refused", key, n)
	}
	resp, err := (&http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}).Get("https://" + host + "/version")
	if err == nil {
		resp.Body.Close()
		t.Errorf("HTTPS GET /version without a client certificate answered %s", resp.Status)
	}
	etcdAuthPositiveControl(ctx, t, host, pool, key)

	// The API server still reads through its client certificate.
	got, err := shared.Client().CoreV1().Secrets("default").Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil || string(got.Data["password"]) != "not-for-other-users" {
		t.Fatalf("the API server cannot read from etcd: %v", err)
	}
}
