// Command latch-local runs the whole attach/detach path on one machine: an
// embedded etcd and kube-apiserver, the real kube-scheduler and
// kube-controller-manager and one hollow kubelet per node as child
// processes (--real-nodes, the default; or the in-process kubelet stand-in),
// the mock CSI driver, csi-attacher and the attach/detach controller.
//
//	latch-local demo   walk a Pod's volume through attach, a multi-attach conflict and detach
//	latch-local up     keep everything running and write a kubeconfig for kubectl
//	latch-local up --upstream
//	                   the same with upstream's external-attacher and kube-controller-manager's
//	                   attach/detach controller instead of latch's, to rehearse docs/migration.md
//	latch-local start|stop|restart COMPONENT
//	                   start or stop a component of a running `up --upstream` (the swap's steps)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/latchlocal"
	"github.com/latchcsi/latch/internal/testsupport"
)

type config struct {
	command    string
	output     string // text or json
	opts       latchlocal.Options
	logFile    string
	verbosity  string
	noColor    bool
	kubeconfig string
	// metricsPorts: csi-attacher's and the controller's metrics ports.
	metricsPorts string
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: latch-local demo|up [flags]\n       latch-local start|stop|restart COMPONENT [--kubeconfig FILE]\n\n")
	fmt.Fprintf(w, "  demo  walk a Pod's volume through attach, a multi-attach conflict and detach, then exit\n")
	fmt.Fprintf(w, "  up    keep the control plane, nodes, driver and controllers running; Ctrl-C stops\n")
	fmt.Fprintf(w, "        (--upstream: upstream's attacher and attach/detach controller instead of latch's)\n")
	fmt.Fprintf(w, "  start, stop, restart: the swap's steps on a running `latch-local up --upstream`\n")
	fmt.Fprintf(w, "        (docs/migration.md, \"Rehearsing the swap on latch-local\"):\n")
	for _, l := range strings.Split(latchlocal.ControlUsage, "\n") {
		fmt.Fprintf(w, "          %s\n", l)
	}
	fmt.Fprintf(w, "        --kubeconfig: the kubeconfig up wrote (default ./latch-local.kubeconfig)\n\nFlags of demo and up:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func parse(args []string, stderr io.Writer) (*config, *flag.FlagSet, error) {
	c := &config{}
	fs := flag.NewFlagSet("latch-local", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&c.opts.Nodes, "nodes", 2, "Number of simulated nodes (the demo needs at least 2).")
	fs.StringVar(&c.opts.Driver, "driver", "mock.csi.latch.dev", "CSI driver name of the mock driver.")
	fs.DurationVar(&c.opts.PublishLatency, "publish-latency", 20*time.Millisecond, "Latency the mock driver adds to ControllerPublishVolume.")
	fs.DurationVar(&c.opts.UnpublishLatency, "unpublish-latency", 20*time.Millisecond, "Latency the mock driver adds to ControllerUnpublishVolume.")
	fs.Func("backend", "Model a storage backend behind the mock driver's ControllerPublishVolume and ControllerUnpublishVolume: "+strings.Join(csimock.ProfileNames(), ", ")+" (docs/csi-mock-driver.md, Backend model). Its latency adds to --publish-latency and --unpublish-latency.", func(s string) error {
		b, err := csimock.ProfileBackend(s)
		c.opts.Backend = &b
		return err
	})
	fs.Int64Var(&c.opts.PublishFailures, "publish-failures", 0, "Fail the first N ControllerPublishVolume calls with Unavailable (watch the retry).")
	fs.StringVar(&c.output, "output", "text", "Output format of demo: text or json.")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "Where to write the admin kubeconfig (up: default ./latch-local.kubeconfig).")
	fs.StringVar(&c.opts.DataDir, "data-dir", "", "Keep the cluster's data here across runs (default: a temporary directory).")
	fs.StringVar(&c.logFile, "log-file", "", "Component logs go here (default: a file in the temporary directory).")
	fs.StringVar(&c.verbosity, "v", "0", "Log verbosity of the components (klog -v).")
	fs.BoolVar(&c.noColor, "no-color", false, "Never use colour.")
	fs.StringVar(&c.metricsPorts, "metrics-ports", "18080,18081", "up: ports on 127.0.0.1 where csi-attacher and attachdetach-controller serve their Prometheus metrics (/metrics), as ATTACHER,CONTROLLER; empty serves none.")
	fs.BoolVar(&c.opts.Upstream, "upstream", false, "up: run upstream's external-attacher v4.13.0 (as the driver's ServiceAccount default/csi-attacher with a driver chart's RBAC) and kube-controller-manager with --controllers=* (its attach/detach controller) instead of latch's csi-attacher and attachdetach-controller, built from test/upstream on first use; `latch-local start|stop|restart` then swap them for latch's step by step, as docs/migration.md shows.")
	fs.BoolVar(&c.opts.RealNodes, "real-nodes", true, "Run the real kube-scheduler, kube-controller-manager and one hollow kubelet (the real kubelet, fake container runtime and mounter) per node, built from test/upstream on first use; false runs latch-local's kubelet stand-in instead, with kube-controller-manager's PV binder alone (no scheduler: Pods must name their node).")
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		return nil, fs, flag.ErrHelp
	}
	c.command = args[0]
	if c.command != "demo" && c.command != "up" {
		return nil, fs, fmt.Errorf("unknown command %q (want demo or up)", c.command)
	}
	err := fs.Parse(args[1:])
	if err != nil {
		return nil, fs, err
	}
	if c.output != "text" && c.output != "json" {
		return nil, fs, fmt.Errorf("--output must be text or json, got %q", c.output)
	}
	if c.command == "demo" && c.opts.Upstream {
		return nil, fs, errors.New("--upstream is a mode of up; the demo runs latch's controllers")
	}
	if c.opts.Upstream && !c.opts.RealNodes {
		return nil, fs, errors.New("--upstream needs real nodes (drop --real-nodes=false)")
	}
	if c.command == "demo" && c.opts.Nodes < 2 {
		return nil, fs, fmt.Errorf("the demo needs --nodes of at least 2, got %d", c.opts.Nodes)
	}
	if c.command == "up" {
		if c.opts.AttacherMetricsAddress, c.opts.ControllerMetricsAddress, err = metricsAddresses(c.metricsPorts); err != nil {
			return nil, fs, err
		}
	}
	if c.command == "up" && c.kubeconfig == "" {
		c.kubeconfig = "latch-local.kubeconfig"
	}
	c.opts.Kubeconfig = c.kubeconfig
	return c, fs, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	// The upstream binaries real nodes need are built into a temporary
	// directory (testsupport.UpstreamBinary): gone when latch-local exits.
	defer testsupport.RemoveBinaries()
	if len(args) > 0 && (args[0] == "start" || args[0] == "stop" || args[0] == "restart") {
		return control(args, stdout, stderr)
	}
	c, fs, err := parse(args, stderr)
	if err == flag.ErrHelp {
		usage(stdout, fs)
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "latch-local:", err)
		usage(stderr, fs)
		return 2
	}
	logPath, logFile, closeLogs, err := setupLogging(c)
	if err != nil {
		fmt.Fprintln(stderr, "latch-local:", err)
		return 1
	}
	defer closeLogs()
	c.opts.EtcdLogOutput = logPath
	c.opts.ProcessOutput = logFile

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())

	term := newTerminal(stdout, c.noColor, c.output == "json")
	if c.opts.Upstream {
		term.info("Starting kube-apiserver, kube-scheduler, kube-controller-manager (--controllers=*: its attach/detach controller too), %d hollow kubelets, the mock driver %s and upstream's external-attacher (logs: %s)", c.opts.Nodes, c.opts.Driver, logPath)
	} else if c.opts.RealNodes {
		term.info("Starting kube-apiserver, kube-scheduler, kube-controller-manager, %d hollow kubelets, the mock driver %s, csi-attacher and attachdetach-controller (logs: %s)", c.opts.Nodes, c.opts.Driver, logPath)
	} else {
		term.info("Starting kube-apiserver, kube-controller-manager (its PV binder alone), %d simulated nodes (kubelet stand-in), the mock driver %s, csi-attacher and attachdetach-controller (logs: %s)", c.opts.Nodes, c.opts.Driver, logPath)
	}
	// The upstream binaries are built on first use: a cold build takes
	// minutes, so say what is built and show progress while it runs.
	testsupport.SetBuildProgress(stderr)
	defer testsupport.SetBuildProgress(nil)
	startedAt := time.Now()
	env, err := latchlocal.Start(ctx, c.opts)
	if err != nil {
		fmt.Fprintln(stderr, "latch-local: start:", err)
		return 1
	}
	defer env.Stop()
	term.info("Ready in %s", time.Since(startedAt).Round(100*time.Millisecond))

	if c.command == "up" {
		return up(ctx, c, env, term)
	}
	result := latchlocal.RunDemo(ctx, env, term)
	if c.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(result)
	} else {
		term.summary(result)
	}
	if !result.OK {
		fmt.Fprintf(stderr, "latch-local: demo failed at step %q: %s\n", result.FailedStep, result.Error)
		return 1
	}
	return 0
}

func up(ctx context.Context, c *config, env *latchlocal.Env, term *terminal) int {
	abs, _ := filepath.Abs(c.kubeconfig)
	term.info("Everything is running. In another terminal:")
	if c.opts.Upstream {
		fmt.Fprintf(term.w, `
  export KUBECONFIG=%s
  kubectl apply -f examples/statefulset.yaml    # attached by upstream's pair

  then swap them for latch's step by step (RBAC, latch-local start|stop|restart):
  docs/migration.md, "Rehearsing the swap on latch-local"

`, abs)
	} else if c.opts.RealNodes {
		fmt.Fprintf(term.w, `
  export KUBECONFIG=%s
  kubectl get nodes
  kubectl apply -f examples/statefulset.yaml
  kubectl get pods,pvc,volumeattachments -o wide
  kubectl delete -f examples/statefulset.yaml

`, abs)
	} else {
		fmt.Fprintf(term.w, `
  export KUBECONFIG=%s
  kubectl get nodes
  kubectl apply -f examples/pv-pvc.yaml -f examples/pod.yaml
  kubectl get volumeattachments -w
  kubectl delete pod app-1

`, abs)
	}
	printMetrics(term.w, c.opts)
	fmt.Fprintln(term.w, "Press Ctrl-C to stop.")
	select {
	case <-ctx.Done():
		term.info("Stopping")
		return 0
	case err := <-env.Err():
		fmt.Fprintln(os.Stderr, "latch-local: a component stopped:", err)
		return 1
	}
}

// control is `latch-local start|stop|restart COMPONENT [FLAGS]`: the
// command goes to the latch-local up --upstream behind the kubeconfig
// (latchlocal.Control), which prints what it did.
func control(args []string, stdout, stderr io.Writer) int {
	kubeconfig := "latch-local.kubeconfig"
	var command []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--kubeconfig" || a == "-kubeconfig":
			if i+1 == len(args) {
				fmt.Fprintln(stderr, "latch-local: --kubeconfig needs a file")
				return 2
			}
			kubeconfig = args[i+1]
			i++
		case strings.HasPrefix(a, "--kubeconfig=") || strings.HasPrefix(a, "-kubeconfig="):
			_, kubeconfig, _ = strings.Cut(a, "=")
		case a == "-h" || a == "--help":
			fmt.Fprintln(stdout, latchlocal.ControlUsage)
			return 0
		default:
			command = append(command, a)
		}
	}
	if len(command) < 2 {
		fmt.Fprintf(stderr, "latch-local: %s needs a component:\n%s\n", args[0], latchlocal.ControlUsage)
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "latch-local: %s: %v (start latch-local up --upstream first, or name its kubeconfig with --kubeconfig)\n", kubeconfig, err)
		return 1
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "latch-local:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := latchlocal.Control(ctx, client, command, stdout); err != nil {
		fmt.Fprintln(stderr, "latch-local:", err)
		return 1
	}
	return 0
}

// setupLogging sends klog (the API server, the controllers) to a file so
// the terminal shows only the demo.
func setupLogging(c *config) (string, io.Writer, func(), error) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	path := c.logFile
	if path == "" {
		dir, err := os.MkdirTemp("", "latch-local-logs")
		if err != nil {
			return "", nil, nil, err
		}
		path = filepath.Join(dir, "latch-local.log")
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", nil, nil, fmt.Errorf("open log file: %w", err)
	}
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL", "v": c.verbosity} {
		if err := fs.Set(k, v); err != nil {
			return "", nil, nil, err
		}
	}
	klog.SetOutput(f)
	return path, f, func() { klog.Flush(); f.Close() }, nil
}

// metricsAddresses turns --metrics-ports into the controllers' loopback
// metrics addresses ("" for both when empty).
func metricsAddresses(ports string) (attacher, controller string, err error) {
	if ports == "" {
		return "", "", nil
	}
	parts := strings.Split(ports, ",")
	if len(parts) != 2 {
		return "", "", fmt.Errorf("--metrics-ports must be two ports, csi-attacher's and attachdetach-controller's (e.g. 18080,18081), or empty; got %q", ports)
	}
	var addrs [2]string
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > 65535 {
			return "", "", fmt.Errorf("--metrics-ports: %q is not a port (1-65535)", p)
		}
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(n))
	}
	if addrs[0] == addrs[1] {
		return "", "", fmt.Errorf("--metrics-ports: the two controllers need two ports, got %q", ports)
	}
	return addrs[0], addrs[1], nil
}

// printMetrics says where the controllers' metrics are (up).
func printMetrics(w io.Writer, opts latchlocal.Options) {
	if opts.AttacherMetricsAddress == "" {
		return
	}
	fmt.Fprintf(w, `Metrics (Prometheus text format, on loopback only; --metrics-ports moves them):
  csi-attacher             http://%s/metrics
  attachdetach-controller  http://%s/metrics

`, opts.AttacherMetricsAddress, opts.ControllerMetricsAddress)
	if opts.Upstream {
		fmt.Fprint(w, "  (with --upstream: once latch-local start runs them)\n\n")
	}
}
