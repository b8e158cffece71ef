package stack

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The real upstream peers, run as child processes next to (or instead of)
// latch's own: the CSI external-attacher sidecar and kube-controller-manager
// running only its attach/detach controller. Both are built by
// testsupport.UpstreamBinary from the modules under test/upstream (the
// first build of kube-controller-manager takes minutes).
//
// Each is started with the flags its own deployment uses, an HTTP(S)
// endpoint on a free loopback port that serves /metrics, and the caller's
// extra flags last (a later flag overrides an earlier one).

// Upstream is a running upstream process.
type Upstream struct {
	*Component
	// Args are the flags it was started with.
	Args []string
	// MetricsURL is its /metrics (http for the external-attacher, https
	// for kube-controller-manager).
	MetricsURL string
	// HealthURL answers 200 once it serves (the attacher's /metrics,
	// kube-controller-manager's /healthz).
	HealthURL string
	client    *http.Client
	crash     func()
}

// Crash kills the process with SIGKILL (no Lease release, nothing
// finished) and waits for it to be gone.
func (u *Upstream) Crash() error {
	u.crash()
	return u.Stop()
}

// UpstreamAttacherConfig configures the upstream external-attacher.
type UpstreamAttacherConfig struct {
	// Name is the component's name (default "external-attacher").
	Name       string
	CSIAddress string
	Kubeconfig string
	// V is --v (default 5, as upstream's deploy example).
	V int
	// Timeout is --timeout (0: upstream's default, 15s).
	Timeout time.Duration
	// LeaderElection turns --leader-election on, with the Lease in
	// LeaderElectionNamespace (default "default": out of a cluster upstream
	// has no Pod namespace to default to).
	LeaderElection          bool
	LeaderElectionNamespace string
	// HTTPEndpoint is --http-endpoint (default: a free loopback port).
	HTTPEndpoint string
	// Args are extra flags, after the ones above.
	Args []string
	// Output receives stdout and stderr (nil: discarded).
	Output io.Writer
}

// UpstreamAttacherArgs are the flags StartUpstreamAttacher passes for c
// (HTTPEndpoint must be set).
func UpstreamAttacherArgs(c UpstreamAttacherConfig) []string {
	args := []string{
		"--v=" + strconv.Itoa(cmp.Or(c.V, 5)),
		"--csi-address=" + c.CSIAddress,
		"--kubeconfig=" + c.Kubeconfig,
		"--http-endpoint=" + c.HTTPEndpoint,
	}
	if c.Timeout > 0 {
		args = append(args, "--timeout="+c.Timeout.String())
	}
	if c.LeaderElection {
		args = append(args, "--leader-election", "--leader-election-namespace="+cmp.Or(c.LeaderElectionNamespace, "default"))
	}
	return append(args, c.Args...)
}

// StartUpstreamAttacher builds (once per process) and starts the upstream
// external-attacher v4.13.0 and waits until its HTTP endpoint answers.
func StartUpstreamAttacher(ctx context.Context, c UpstreamAttacherConfig) (*Upstream, error) {
	bin, err := prepareUpstream("external-attacher", &c.Name, &c.HTTPEndpoint)
	if err != nil {
		return nil, err
	}
	u := &Upstream{
		Args:       UpstreamAttacherArgs(c),
		MetricsURL: "http://" + c.HTTPEndpoint + "/metrics",
		client:     &http.Client{Timeout: 5 * time.Second},
	}
	u.HealthURL = u.MetricsURL
	return u.start(ctx, c.Name, c.Output, bin)
}

// KubeControllerManagerConfig configures kube-controller-manager.
type KubeControllerManagerConfig struct {
	// Name is the component's name (default "kube-controller-manager").
	Name       string
	Kubeconfig string
	// Controllers is --controllers (default: "attachdetach" only).
	Controllers []string
	// LeaderElect is --leader-elect (Lease kube-controller-manager in
	// kube-system, upstream's defaults).
	LeaderElect bool
	// V is --v (default 2).
	V int
	// SecureAddr is the loopback host:port of its HTTPS endpoint (default:
	// a free one); /metrics, /healthz, /readyz and /livez are served
	// without authorization.
	SecureAddr string
	// CertDir holds its self-signed serving certificate (default: a new
	// temporary directory, removed at Stop).
	CertDir string
	// Args are extra flags, after the ones above.
	Args   []string
	Output io.Writer
}

// KubeControllerManagerArgs are the flags StartKubeControllerManager
// passes for c (SecureAddr and CertDir must be set).
func KubeControllerManagerArgs(c KubeControllerManagerConfig) []string {
	controllers := c.Controllers
	if len(controllers) == 0 {
		controllers = []string{"attachdetach"}
	}
	host, port, _ := net.SplitHostPort(c.SecureAddr)
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=" + strconv.FormatBool(c.LeaderElect),
		"--v=" + strconv.Itoa(cmp.Or(c.V, 2)),
		"--bind-address=" + host,
		"--secure-port=" + port,
		"--cert-dir=" + c.CertDir,
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
		// No cloud: the attach/detach controller needs none.
		"--cloud-provider=",
		"--use-service-account-credentials=false",
	}
	return append(args, c.Args...)
}

// StartKubeControllerManager builds (once per process) and starts
// kube-controller-manager v1.37.2 and waits until its /healthz answers.
func StartKubeControllerManager(ctx context.Context, c KubeControllerManagerConfig) (*Upstream, error) {
	bin, err := prepareUpstream("kube-controller-manager", &c.Name, &c.SecureAddr)
	if err != nil {
		return nil, err
	}
	var tmp string
	if c.CertDir == "" {
		if tmp, err = os.MkdirTemp("", "latch-kcm"); err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		c.CertDir = tmp
	}
	u := &Upstream{
		Args:       KubeControllerManagerArgs(c),
		MetricsURL: "https://" + c.SecureAddr + "/metrics",
		HealthURL:  "https://" + c.SecureAddr + "/healthz",
		// The serving certificate is self-signed and written to CertDir
		// when the process starts: trust what it wrote there.
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // verified against the generated certificate below
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				return verifyAgainstCertFile(filepath.Join(c.CertDir, "kube-controller-manager.crt"), raw)
			},
		}}},
	}
	started, err := u.start(ctx, c.Name, c.Output, bin)
	if err != nil {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		return nil, err
	}
	if tmp != "" {
		go func() { <-started.Exited(); os.RemoveAll(tmp) }()
	}
	return started, nil
}

// verifyAgainstCertFile accepts a serving chain whose leaf is the
// self-signed certificate the process generated in file.
func verifyAgainstCertFile(file string, raw [][]byte) error {
	if len(raw) == 0 {
		return errors.New("no certificate presented")
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read the generated serving certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no certificate in %s", file)
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return err
	}
	inter := x509.NewCertPool()
	for _, r := range raw[1:] {
		if c, err := x509.ParseCertificate(r); err == nil {
			inter.AddCert(c)
		}
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter})
	return err
}

// start runs the binary as an upstreamProcess and waits for HealthURL;
// on failure the process is stopped and the error carries the end of its
// output.
func (u *Upstream) start(ctx context.Context, name string, out io.Writer, bin string) (*Upstream, error) {
	return u.startWith(ctx, name, out, bin, upstreamProcess)
}

// startWith is start with the process started by run.
func (u *Upstream) startWith(ctx context.Context, name string, out io.Writer, bin string,
	run func(ctx context.Context, name string, out io.Writer, binary string, args ...string) (*Component, func(), error)) (*Upstream, error) {
	tail := &testsupport.SyncBuffer{Max: 8 << 10}
	w := io.Writer(tail)
	if out != nil {
		w = io.MultiWriter(out, tail)
	}
	c, crash, err := run(ctx, name, w, bin, u.Args...)
	if err != nil {
		return nil, err
	}
	u.Component, u.crash = c, crash
	if err := u.waitHealthy(ctx, 2*time.Minute); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("%s (%s): %w\n%s", name, strings.Join(u.Args, " "), err, tail.String())
	}
	return u, nil
}

// waitHealthy polls HealthURL until it answers 200, the process exits or
// timeout passes.
func (u *Upstream) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = u.get(ctx, u.HealthURL); last == nil {
			return nil
		}
		select {
		case <-u.Exited():
			return fmt.Errorf("exited before it served: %v", u.Result())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %s: %w", u.HealthURL, timeout, last)
		}
	}
}

func (u *Upstream) get(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return nil
}

// Scrape reads its /metrics.
func (u *Upstream) Scrape(ctx context.Context) (testsupport.Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.MetricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u.MetricsURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u.MetricsURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %d: %s", u.MetricsURL, resp.StatusCode, body)
	}
	return testsupport.ParseText(body)
}

// prepareUpstream builds binary (once per process) and fills in what its
// config left empty: the component's name (the binary's) and its
// endpoint's address (a free loopback port).
func prepareUpstream(binary string, name, addr *string) (string, error) {
	bin, err := testsupport.UpstreamBinary(binary)
	if err != nil {
		return "", err
	}
	if *name == "" {
		*name = binary
	}
	if *addr == "" {
		if *addr, err = freeLoopbackAddr(); err != nil {
			return "", fmt.Errorf("%s: %w", *name, err)
		}
	}
	return bin, nil
}

// freeLoopbackAddr is testsupport.FreeLoopbackAddr.
func freeLoopbackAddr() (string, error) { return testsupport.FreeLoopbackAddr() }

// upstreamProcess is Process for an upstream binary: neither the
// external-attacher nor kube-controller-manager catches SIGTERM, so dying
// of it is how they stop, not a failure. Stop sends SIGTERM, then SIGKILL
// after 30 seconds; crash (Upstream.Crash) sends SIGKILL at once.
func upstreamProcess(ctx context.Context, name string, out io.Writer, binary string, args ...string) (*Component, func(), error) {
	return child(ctx, name, out, diedOfTermOrKill, binary, args...)
}

// diedOfTermOrKill: the process ended cleanly or of SIGTERM (or SIGKILL,
// 30 seconds after it).
func diedOfTermOrKill(err error) bool {
	return err == nil || diedOf(err, syscall.SIGTERM) || diedOf(err, syscall.SIGKILL)
}
