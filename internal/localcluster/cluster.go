// Package localcluster runs a real Kubernetes control plane inside the
// current process: an embedded etcd and kube-apiserver built from Go modules.
// It is for tests, benchmarks and latch-local only; production binaries must
// not link it (a test enforces that).
package localcluster

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

// Options configure Start.
type Options struct {
	// DataDir holds etcd's data and the cluster's certificates. Empty means
	// a new temporary directory.
	DataDir string
	// KeepData leaves DataDir in place at Stop so a later Start with the same
	// DataDir sees the same objects. A temporary DataDir is always removed.
	KeepData bool
	// Logf receives the API server's start-up and shutdown lines (not its
	// klog output). Nil discards them.
	Logf func(format string, args ...any)
	// APIServerFlags are extra kube-apiserver flags.
	APIServerFlags []string
	// EtcdLogOutput is where etcd's own (error-level) log goes: "stderr"
	// (default), "stdout" or a file path.
	EtcdLogOutput string
}

// AdminUser is the user behind the admin token, in group system:masters.
const AdminUser = "latch-admin"

// Cluster is a running control plane. Its address (Host) stays the same
// across StopAPIServer/StartAPIServer, so clients and kubeconfigs survive an
// API server restart the way they would in a real cluster.
type Cluster struct {
	opts     Options
	dataDir  string
	tempData bool

	etcd     *embed.Etcd
	etcdURL  string
	etcdPKI  *etcdPKI
	proxy    *frontProxy
	caData   []byte
	token    string
	tokenCSV string
	// external is the serving PKI of an API server of another release
	// (external.go); nil with the in-process one.
	external *externalPKI

	mu     sync.Mutex
	server *runningServer
}

type runningServer struct {
	tb       *serverTB // nil for an external API server
	teardown func()
}

// Start brings up etcd and the API server and returns when the API server is
// healthy and the default namespace exists.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	c := &Cluster{opts: opts, dataDir: opts.DataDir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.dataDir == "" {
		c.dataDir, err = os.MkdirTemp("", "latch-local-")
		if err != nil {
			return nil, fmt.Errorf("create cluster data dir: %w", err)
		}
		c.tempData = true
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create cluster data dir %s: %w", c.dataDir, err)
	}
	if err := c.writeCredentials(); err != nil {
		return nil, err
	}
	// New certificates at every start, also for a kept DataDir: they only
	// have to outlive this process.
	if c.etcdPKI, err = newEtcdPKI(); err != nil {
		return nil, err
	}
	c.etcd, c.etcdURL, err = startEtcd(filepath.Join(c.dataDir, "etcd"), opts.EtcdLogOutput, c.etcdPKI, 30*time.Second)
	if err != nil {
		return nil, err
	}
	c.proxy, err = newFrontProxy()
	if err != nil {
		return nil, fmt.Errorf("listen for API clients: %w", err)
	}
	if err := c.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	// No service account controller runs here; Pods in "default" need its
	// ServiceAccount to pass admission.
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}}
	if _, err := c.Client().CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create default ServiceAccount: %w", err)
	}
	return c, nil
}

// writeCredentials creates (or reuses, for a kept DataDir) a static admin
// token, so that clients stay valid across API server restarts.
func (c *Cluster) writeCredentials() error {
	dir := filepath.Join(c.dataDir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	c.tokenCSV = filepath.Join(dir, "tokens.csv")
	tokenFile := filepath.Join(dir, "admin.token")

	if tok, err := os.ReadFile(tokenFile); err == nil && len(tok) > 0 {
		c.token = string(tok)
	} else {
		c.token = randomToken()
		if err := os.WriteFile(tokenFile, []byte(c.token), 0o600); err != nil {
			return err
		}
	}
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", c.token, AdminUser, AdminUser)
	return os.WriteFile(c.tokenCSV, []byte(line), 0o600)
}

// StartAPIServer starts kube-apiserver on the existing etcd. It is an error
// to call it while one is running.
func (c *Cluster) StartAPIServer(ctx context.Context) (err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server != nil {
		return errors.New("API server already running")
	}
	if r, external, err := testsupport.ExternalAPIServer(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	} else if external {
		return c.startExternalAPIServerLocked(ctx, r)
	}
	tb := &serverTB{name: "latch-local", logf: c.opts.Logf}
	defer func() {
		if r := recover(); r != nil {
			abort, ok := r.(fatalAbort)
			if !ok {
				panic(r)
			}
			tb.runCleanups()
			err = fmt.Errorf("start kube-apiserver: %s", abort.msg)
		}
	}()

	storage := storagebackend.NewDefaultConfig("/registry", nil)
	storage.Transport.ServerList = []string{c.etcdURL}
	storage.Transport.TrustedCAFile = c.etcdPKI.CAFile
	storage.Transport.CertFile = c.etcdPKI.ClientCert
	storage.Transport.KeyFile = c.etcdPKI.ClientKey
	flags := []string{
		"--token-auth-file=" + c.tokenCSV,
		"--authorization-mode=RBAC",
		"--enable-priority-and-fairness=true",
	}
	flags = append(flags, c.opts.APIServerFlags...)

	type result struct {
		srv apiservertesting.TestServer
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				if abort, ok := r.(fatalAbort); ok {
					done <- result{err: errors.New(abort.msg)}
					return
				}
				panic(r)
			}
		}()
		srv, err := apiservertesting.StartTestServer(tb, apiservertesting.NewDefaultTestServerOptions(), flags, storage)
		done <- result{srv: srv, err: err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		// The start goroutine finishes on its own (it polls with its own
		// timeouts); tear it down when it does.
		go func() {
			if r := <-done; r.err == nil {
				r.srv.TearDownFn()
			}
			tb.runCleanups()
		}()
		return fmt.Errorf("start kube-apiserver: %w", ctx.Err())
	}
	if r.err != nil {
		tb.runCleanups()
		return fmt.Errorf("start kube-apiserver: %w", r.err)
	}
	c.server = &runningServer{tb: tb, teardown: r.srv.TearDownFn}
	backend := hostPort(r.srv.ClientConfig.Host)
	if c.caData == nil {
		if c.caData, err = servingCA(backend); err != nil {
			return err
		}
	}
	c.proxy.setBackend(backend)
	return nil
}

// StopAPIServer stops kube-apiserver and drops every client connection;
// etcd and the cluster address stay. Clients get connection errors until
// StartAPIServer is called again.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopAPIServerLocked()
}

func (c *Cluster) stopAPIServerLocked() {
	if c.server == nil {
		return
	}
	if c.proxy != nil {
		c.proxy.setBackend("")
	}
	c.server.teardown()
	if c.server.tb != nil {
		c.server.tb.runCleanups()
	}
	c.server = nil
}

// RestartAPIServer stops and starts kube-apiserver on the same etcd data.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.StopAPIServer()
	return c.StartAPIServer(ctx)
}

// Stop stops everything. It removes the data directory unless KeepData was
// set for a caller-provided DataDir.
func (c *Cluster) Stop() {
	c.mu.Lock()
	c.stopAPIServerLocked()
	c.mu.Unlock()
	if c.proxy != nil {
		c.proxy.close()
		c.proxy = nil
	}
	if c.etcd != nil {
		c.etcd.Close()
		c.etcd = nil
	}
	c.etcdPKI.remove()
	c.etcdPKI = nil
	if c.external != nil {
		c.external.remove()
		c.external = nil
	}
	if c.dataDir != "" && (c.tempData || !c.opts.KeepData) {
		os.RemoveAll(c.dataDir)
	}
}

// Host is the https URL clients use; stable for the cluster's lifetime.
func (c *Cluster) Host() string { return "https://" + c.proxy.addr() }

// DataDir is where etcd data and credentials live.
func (c *Cluster) DataDir() string { return c.dataDir }

// EtcdURL is the embedded etcd's client URL (https; etcd answers only
// clients with the certificate the API server uses).
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// RESTConfig returns a new admin client config (system:masters) for the
// cluster. Callers may change QPS, Burst and UserAgent on it.
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            c.Host(),
		BearerToken:     c.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caData},
		QPS:             1000,
		Burst:           2000,
	}
}

// AnonymousConfig returns a client config carrying only the cluster's
// address and CA, for callers that bring their own credentials (for example
// a ServiceAccount token).
func (c *Cluster) AnonymousConfig() *rest.Config {
	return &rest.Config{
		Host:            c.Host(),
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caData},
		QPS:             1000,
		Burst:           2000,
	}
}

// ServiceAccountConfig returns a client config that authenticates as the
// ServiceAccount namespace/name, with a token the API server issues for
// it (TokenRequest) and nothing else: what a Pod running as it has. RBAC
// tests run components with it.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	admin, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return nil, err
	}
	tok, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := c.AnonymousConfig()
	cfg.BearerToken = tok.Status.Token
	return cfg, nil
}

// Client returns an admin clientset.
func (c *Cluster) Client() kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(c.RESTConfig())
}

// WriteKubeconfig writes an admin kubeconfig usable by kubectl and by the
// latch binaries.
func (c *Cluster) WriteKubeconfig(path string) error {
	return WriteKubeconfig(path, c.RESTConfig())
}

// WriteKubeconfig writes cfg (host, CA data and bearer token) as a kubeconfig.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["latch-local"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos["latch-local"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["latch-local"] = &clientcmdapi.Context{Cluster: "latch-local", AuthInfo: "latch-local", Namespace: "default"}
	kc.CurrentContext = "latch-local"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

func hostPort(host string) string {
	// ClientConfig.Host is "https://127.0.0.1:NNNN" (or without scheme).
	for _, p := range []string{"https://", "http://"} {
		if len(host) > len(p) && host[:len(p)] == p {
			return host[len(p):]
		}
	}
	return host
}

// servingCA returns the CA certificate the API server presents. The
// in-process test server always serves the same fixture certificate chain
// (leaf and CA) for the loopback addresses, so the CA read once stays valid
// across restarts. Reading it over a loopback handshake avoids depending on
// where the module cache keeps the fixture.
func servingCA(addr string) ([]byte, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the cert to pin it
	if err != nil {
		return nil, fmt.Errorf("read API server certificate: %w", err)
	}
	defer conn.Close()
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, errors.New("read API server certificate: no certificate presented")
	}
	ca := chain[len(chain)-1]
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), nil
}
