// Command latchctl explains why a CSI volume attachment is stuck: where a
// Pod's, PVC's, PV's or VolumeAttachment's volume stands in the attach
// pipeline and what to do next. Installed as kubectl-latch it is the
// kubectl plugin `kubectl latch`. See docs/latchctl.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/diagnose"
	"github.com/latchcsi/latch/internal/diagnose/fetch"
	"github.com/latchcsi/latch/internal/diagnose/render"
	"github.com/latchcsi/latch/internal/version"
)

// Exit codes, documented in docs/latchctl.md.
const (
	exitHealthy = 0
	exitProblem = 1
	exitError   = 2
	// exitPendingTooLong: status --fail-pending-older found an attach or
	// detach pending longer than that (it wins over exitProblem: the
	// caller asked about exactly this).
	exitPendingTooLong = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[0], os.Args[1:], os.Stdout, os.Stderr, time.Now)
	stop()
	os.Exit(code)
}

// run executes one command and returns the exit code. now is the clock
// ages are measured with (tests pin it).
func run(ctx context.Context, argv0 string, args []string, stdout, stderr io.Writer, now func() time.Time) int {
	if words, ok := completionRequest(argv0, args); ok {
		// A shell waits for the answer: errors mean no completions.
		if err := writeCompletions(ctx, stdout, words, apiNames); err != nil {
			return exitError
		}
		return exitHealthy
	}
	prog := programName(argv0)
	cfg, err := parseArgs(args, prog, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return exitHealthy
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", prog, err, prog)
		return exitError
	}
	switch cfg.Command {
	case "version":
		fmt.Fprintln(stdout, prog, version.Version)
		return exitHealthy
	case "completion":
		// For the binary's own name: kubectl completes its plugins itself.
		if err := writeCompletion(stdout, cfg.Shell, "latchctl"); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", prog, err)
			return exitError
		}
		return exitHealthy
	}
	if err := setUpLogging(cfg.Verbosity, stderr); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitError
	}
	defer klog.Flush()
	ctx = klog.NewContext(ctx, klog.Background().WithName("latchctl"))

	code, err := execute(ctx, cfg, stdout, now)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitError
	}
	return code
}

func execute(ctx context.Context, cfg *Config, stdout io.Writer, now func() time.Time) (int, error) {
	client, namespace, err := newClient(cfg.Kube, cfg.Timeout)
	if err != nil {
		return exitError, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	switch cfg.Command {
	case "explain":
		target := cfg.Target
		if (target.Kind == diagnose.TargetPod || target.Kind == diagnose.TargetPVC) && target.Namespace == "" {
			target.Namespace = namespace
		}
		snap, err := fetch.Snapshot(ctx, client, target, now())
		if err != nil {
			return exitError, err
		}
		report := diagnose.Explain(target, snap)
		if err := render.Report(stdout, report, cfg.Output); err != nil {
			return exitError, err
		}
		if !report.Healthy() {
			return exitProblem, nil
		}
		return exitHealthy, nil
	case "status":
		vas, err := fetch.VolumeAttachments(ctx, client)
		if err != nil {
			return exitError, err
		}
		rows, err := diagnose.Attachments(now(), vas, diagnose.StatusOptions{Driver: cfg.Driver, SortBy: cfg.SortBy})
		if err != nil {
			return exitError, err
		}
		findings := diagnose.StatusFindings(vas)
		var tooLong []diagnose.Finding
		if cfg.FailPendingOlder > 0 {
			tooLong = diagnose.PendingFindings(rows, cfg.FailPendingOlder)
		}
		if err := render.StatusWithFindings(stdout, rows, append(findings, tooLong...), cfg.Output); err != nil {
			return exitError, err
		}
		if len(tooLong) > 0 {
			return exitPendingTooLong, nil
		}
		if diagnose.Failing(rows) || (diagnose.Report{Findings: findings}).Problems() > 0 {
			return exitProblem, nil
		}
		return exitHealthy, nil
	}
	return exitError, fmt.Errorf("unknown command %q", cfg.Command)
}

// newClient loads the kubeconfig with kubectl's rules and returns a client
// and the namespace of the selected context ("default" if it has none).
func newClient(kc KubeConfig, timeout time.Duration) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kc.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kc.Context}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	restCfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("load kubeconfig: %w", err)
	}
	namespace, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("namespace from kubeconfig: %w", err)
	}
	restCfg = rest.CopyConfig(restCfg)
	restCfg.UserAgent = "latchctl"
	restCfg.Timeout = timeout
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, "", fmt.Errorf("create API client: %w", err)
	}
	return client, namespace, nil
}

// setUpLogging points klog at stderr with the requested verbosity. klog's
// configuration is process-global; this is the one place that sets it.
func setUpLogging(verbosity int, stderr io.Writer) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{"v": strconv.Itoa(verbosity), "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("configure logging: %w", err)
		}
	}
	klog.SetOutput(stderr)
	return nil
}
