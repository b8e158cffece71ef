package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The API server of another Kubernetes release. With
// testsupport.KubernetesVersionEnv naming a release other than the one
// latch's go.mod pins (make test-versions), the cluster runs that
// release's kube-apiserver binary, built from its module under
// test/upstream, as a child process instead of the in-process one: on the
// same embedded etcd, behind the same front proxy, with the same admin
// token and service-account key, so everything else (clients,
// kubeconfigs, WriteServiceAccountKey, API server restarts) is the same.

// externalStopTimeout bounds the wait for kube-apiserver to exit after
// SIGTERM before it is killed.
const externalStopTimeout = 30 * time.Second

// externalReadyTimeout bounds the wait for a started kube-apiserver to
// answer /readyz (it is built before, not within, this time).
const externalReadyTimeout = 90 * time.Second

// externalPKI is the serving certificate of the external API server, and
// the service-account key, for the cluster's lifetime: the CA clients
// trust stays valid across API server restarts.
type externalPKI struct {
	*etcdPKI // the same throwaway CA scheme: a server certificate for 127.0.0.1 and localhost
	saKey    string
}

func newExternalPKI() (*externalPKI, error) {
	p, err := newEtcdPKI()
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver serving certificate: %w", err)
	}
	saKey := filepath.Join(p.dir, "service-account.key")
	if err := os.WriteFile(saKey, []byte(serviceAccountKeyPEM), 0o600); err != nil {
		p.remove()
		return nil, fmt.Errorf("write service-account key: %w", err)
	}
	return &externalPKI{etcdPKI: p, saKey: saKey}, nil
}

// externalArgs are the flags of an external kube-apiserver serving on
// 127.0.0.1:port: what the in-process test server sets (service-account
// issuer and key, service range), then the cluster's own (token file,
// RBAC, priority and fairness) and Options.APIServerFlags last.
func (c *Cluster) externalArgs(port int, certDir string) []string {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + certDir,
		"--tls-cert-file=" + c.external.ServerCert,
		"--tls-private-key-file=" + c.external.ServerKey,
		"--etcd-servers=" + c.etcdURL,
		"--etcd-prefix=/registry",
		"--etcd-cafile=" + c.etcdPKI.CAFile,
		"--etcd-certfile=" + c.etcdPKI.ClientCert,
		"--etcd-keyfile=" + c.etcdPKI.ClientKey,
		"--service-account-issuer=https://foo.bar.example.com",
		"--service-account-key-file=" + c.external.saKey,
		"--service-account-signing-key-file=" + c.external.saKey,
		"--service-cluster-ip-range=10.0.0.0/16",
		"--token-auth-file=" + c.tokenCSV,
		"--authorization-mode=RBAC",
		"--enable-priority-and-fairness=true",
	}
	return append(args, c.opts.APIServerFlags...)
}

// startExternalAPIServerLocked builds (once per process; kept between
// runs) and starts release r's kube-apiserver and waits until it is ready
// and the default namespace exists. Its output goes to
// kube-apiserver.log in the data directory. c.mu is held.
func (c *Cluster) startExternalAPIServerLocked(ctx context.Context, r testsupport.KubernetesRelease) (err error) {
	fail := func(err error) error {
		return fmt.Errorf("start kube-apiserver %s (%s): %w", r.Version, testsupport.KubernetesVersionEnv, err)
	}
	bin, err := testsupport.UpstreamBinary("kube-apiserver")
	if err != nil {
		return fail(err)
	}
	if c.external == nil {
		if c.external, err = newExternalPKI(); err != nil {
			return fail(err)
		}
		ca, err := os.ReadFile(c.external.CAFile)
		if err != nil {
			return fail(err)
		}
		c.caData = ca
	}
	port, err := freePort()
	if err != nil {
		return fail(err)
	}
	certDir := filepath.Join(c.external.dir, "cert-dir")
	logPath := filepath.Join(c.dataDir, "kube-apiserver.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(bin, c.externalArgs(port, certDir)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Killed with this process, should it die without stopping the cluster.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fail(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(externalStopTimeout):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	backend := "127.0.0.1:" + strconv.Itoa(port)
	if err := c.waitExternalReady(ctx, backend, exited); err != nil {
		stop()
		select {
		case <-exited:
			if waitErr != nil {
				err = fmt.Errorf("%w (exited: %v)", err, waitErr)
			}
		default:
		}
		return fail(fmt.Errorf("%w; its log: %s", err, logTail(logPath, 20)))
	}
	if c.opts.Logf != nil {
		c.opts.Logf("kube-apiserver %s (pid %d) serving on %s, log in %s", r.Version, cmd.Process.Pid, backend, logPath)
	}
	c.server = &runningServer{teardown: stop}
	c.proxy.setBackend(backend)
	return nil
}

// waitExternalReady polls the API server at backend until /readyz answers
// 200 and the default namespace exists, it exits, ctx ends or
// externalReadyTimeout passes.
func (c *Cluster) waitExternalReady(ctx context.Context, backend string, exited <-chan struct{}) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.caData) {
		return errors.New("no CA certificate to verify it with")
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	get := func(path string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+backend+path, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.After(externalReadyTimeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := errors.New("not polled yet")
	for {
		select {
		case <-exited:
			return fmt.Errorf("exited before it was ready (last: %v)", last)
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-deadline:
			return fmt.Errorf("not ready after %s (last: %v)", externalReadyTimeout, last)
		case <-tick.C:
		}
		code, err := get("/readyz")
		if err == nil && code == http.StatusOK {
			code, err = get("/api/v1/namespaces/default")
			if err == nil && code == http.StatusOK {
				return nil
			}
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("HTTP %d", code)
		}
	}
}

// logTail is the last n lines of the file at path, for an error.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n" + strings.Join(lines, "\n")
}
