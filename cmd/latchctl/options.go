package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/latchcsi/latch/internal/diagnose"
	"github.com/latchcsi/latch/internal/diagnose/render"
)

// Config is everything the command line decides.
type Config struct {
	Command string // "explain", "status", "completion" or "version"
	// Shell is the shell whose completion script completion writes.
	Shell string
	// Target is what explain explains; its namespace may still be empty
	// (then the kubeconfig context's namespace applies).
	Target diagnose.Target
	Output render.Format
	SortBy diagnose.SortKey
	Driver string
	// FailPendingOlder, when positive, makes status exit with
	// exitPendingTooLong if an attach or detach has been pending longer.
	FailPendingOlder time.Duration
	Kube             KubeConfig
	Verbosity        int
	Timeout          time.Duration
}

// KubeConfig selects the cluster the standard kubectl way.
type KubeConfig struct {
	Kubeconfig string // --kubeconfig; else $KUBECONFIG, else ~/.kube/config
	Context    string
	Namespace  string // -n; empty = from the context, else "default"
}

// errUsage marks command line errors (exit code 2 with usage hint).
var errUsage = errors.New("usage error")

// programName is "kubectl latch" when the binary runs as a kubectl plugin
// (kubectl-latch): only the usage text depends on the name.
func programName(argv0 string) string {
	// Both separators, whatever the OS: kubectl on Windows passes paths
	// with backslashes.
	base := argv0[strings.LastIndexAny(argv0, `/\`)+1:]
	base = strings.TrimSuffix(base, ".exe")
	if strings.HasPrefix(base, "kubectl-") {
		return "kubectl " + strings.ReplaceAll(strings.TrimPrefix(base, "kubectl-"), "_", "-")
	}
	return "latchctl"
}

func usage(w io.Writer, prog string, fs *pflag.FlagSet) {
	fmt.Fprintf(w, `%[1]s diagnoses stuck CSI volume attachments.

Usage:
  %[1]s explain pod [NAMESPACE/]NAME    walk a Pod's volumes through the attach pipeline
  %[1]s explain pvc [NAMESPACE/]NAME    the same for a PersistentVolumeClaim, on every node that uses it
  %[1]s explain pv NAME                 the same for a PersistentVolume
  %[1]s explain va NAME                 one VolumeAttachment (a unique name prefix is enough)
  %[1]s status                          table of VolumeAttachments
  %[1]s completion bash|zsh|fish        shell completion script
  %[1]s version                         latchctl's version

Exit codes: 0 no problem found, 1 a problem was found, 2 usage or API error,
3 (status --fail-pending-older) an attach or detach pending longer than that.

Flags:
`, prog)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func newFlagSet(cfg *Config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("latchctl", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&cfg.Kube.Kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&cfg.Kube.Context, "context", "", "kubeconfig context to use")
	fs.StringVarP(&cfg.Kube.Namespace, "namespace", "n", "", "namespace of the Pod or PVC (default: the context's namespace)")
	fs.StringVarP((*string)(&cfg.Output), "output", "o", "", "output format: text|json|yaml for explain, table|wide|json|yaml for status")
	fs.StringVar((*string)(&cfg.SortBy), "sort-by", string(diagnose.SortDriver), "status: order rows by driver|node|age|name")
	fs.StringVar(&cfg.Driver, "driver", "", "status: only VolumeAttachments of this CSI driver")
	fs.DurationVar(&cfg.FailPendingOlder, "fail-pending-older", 0, "status: exit 3, listing them, when an attach or detach has been pending longer than this (e.g. 5m)")
	fs.DurationVar(&cfg.Timeout, "request-timeout", 30*time.Second, "give up on the API server after this long")
	fs.IntVarP(&cfg.Verbosity, "v", "v", 0, "log verbosity (klog), to stderr")
	fs.Bool("version", false, "print latchctl's version and exit (the same as the version command)")
	return fs
}

// parseArgs turns the command line into a Config. It returns pflag.ErrHelp
// after printing usage for -h, and an error wrapping errUsage otherwise.
func parseArgs(args []string, prog string, stderr io.Writer) (*Config, error) {
	cfg := &Config{}
	fs := newFlagSet(cfg)
	fs.Usage = func() {}     // printed below, once, whatever pflag decides
	fs.SetOutput(io.Discard) // errors are printed once, by run
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			usage(stderr, prog, fs)
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	pos := fs.Args()
	if v, _ := fs.GetBool("version"); v {
		pos = []string{"version"}
	}
	if len(pos) == 0 {
		return nil, fmt.Errorf("%w: missing command (explain or status)", errUsage)
	}
	cfg.Command = pos[0]
	switch cfg.Command {
	case "explain":
		if fs.Changed("sort-by") || fs.Changed("driver") || fs.Changed("fail-pending-older") {
			return nil, fmt.Errorf("%w: --sort-by, --driver and --fail-pending-older apply to status only", errUsage)
		}
		if cfg.Output == "" {
			cfg.Output = render.Text
		}
		if !slices.Contains(render.ExplainFormats(), cfg.Output) {
			return nil, fmt.Errorf("%w: -o %s: explain prints one of %v", errUsage, cfg.Output, render.ExplainFormats())
		}
		t, err := parseTarget(pos[1:], cfg.Kube.Namespace)
		if err != nil {
			return nil, err
		}
		cfg.Target = t
	case "status":
		if len(pos) > 1 {
			return nil, fmt.Errorf("%w: status takes no arguments, got %q", errUsage, pos[1:])
		}
		if cfg.Output == "" {
			cfg.Output = render.Table
		}
		if !slices.Contains(render.StatusFormats(), cfg.Output) {
			return nil, fmt.Errorf("%w: -o %s: status prints one of %v", errUsage, cfg.Output, render.StatusFormats())
		}
		if !slices.Contains(diagnose.SortKeys(), cfg.SortBy) {
			return nil, fmt.Errorf("%w: --sort-by %s: want one of %v", errUsage, cfg.SortBy, diagnose.SortKeys())
		}
		if cfg.FailPendingOlder < 0 || (fs.Changed("fail-pending-older") && cfg.FailPendingOlder == 0) {
			return nil, fmt.Errorf("%w: --fail-pending-older %s: want a positive duration", errUsage, cfg.FailPendingOlder)
		}
	case "version":
		if len(pos) > 1 {
			return nil, fmt.Errorf("%w: version takes no arguments, got %q", errUsage, pos[1:])
		}
	case "completion":
		if len(pos) != 2 || !slices.Contains(completionShells, pos[1]) {
			return nil, fmt.Errorf("%w: completion takes one of %v", errUsage, completionShells)
		}
		cfg.Shell = pos[1]
	case "help":
		usage(stderr, prog, fs)
		return nil, pflag.ErrHelp
	default:
		return nil, fmt.Errorf("%w: unknown command %q (want explain, status, completion or version)", errUsage, cfg.Command)
	}
	return cfg, nil
}

// kindAliases are the names kubectl users type for the four kinds.
func kindAliases() map[string]diagnose.TargetKind {
	return map[string]diagnose.TargetKind{
		"pod": diagnose.TargetPod, "pods": diagnose.TargetPod, "po": diagnose.TargetPod,
		"pvc": diagnose.TargetPVC, "pvcs": diagnose.TargetPVC, "persistentvolumeclaim": diagnose.TargetPVC, "persistentvolumeclaims": diagnose.TargetPVC,
		"pv": diagnose.TargetPV, "pvs": diagnose.TargetPV, "persistentvolume": diagnose.TargetPV, "persistentvolumes": diagnose.TargetPV,
		"va": diagnose.TargetVA, "vas": diagnose.TargetVA, "volumeattachment": diagnose.TargetVA, "volumeattachments": diagnose.TargetVA,
	}
}

// parseTarget accepts "KIND NAME", "KIND NS/NAME" and kubectl's
// "KIND/NAME". The namespace given with -n and the one in NS/NAME must
// agree when both are given.
func parseTarget(pos []string, flagNS string) (diagnose.Target, error) {
	if len(pos) == 1 {
		if kind, rest, ok := strings.Cut(pos[0], "/"); ok {
			if _, known := kindAliases()[strings.ToLower(kind)]; known {
				pos = []string{kind, rest}
			}
		}
	}
	if len(pos) != 2 {
		return diagnose.Target{}, fmt.Errorf("%w: explain wants a kind (pod, pvc, pv, va) and a name", errUsage)
	}
	kind, ok := kindAliases()[strings.ToLower(pos[0])]
	if !ok {
		return diagnose.Target{}, fmt.Errorf("%w: unknown kind %q (want pod, pvc, pv or va)", errUsage, pos[0])
	}
	t := diagnose.Target{Kind: kind, Name: pos[1]}
	namespaced := kind == diagnose.TargetPod || kind == diagnose.TargetPVC
	if ns, name, ok := strings.Cut(pos[1], "/"); ok {
		if !namespaced {
			return diagnose.Target{}, fmt.Errorf("%w: a %s is not namespaced; give just its name", errUsage, kind)
		}
		if flagNS != "" && flagNS != ns {
			return diagnose.Target{}, fmt.Errorf("%w: namespace %q in %q contradicts -n %s", errUsage, ns, pos[1], flagNS)
		}
		t.Namespace, t.Name = ns, name
	} else if namespaced {
		t.Namespace = flagNS
	}
	if t.Name == "" || (namespaced && strings.HasSuffix(pos[1], "/")) {
		return diagnose.Target{}, fmt.Errorf("%w: empty name in %q", errUsage, pos[1])
	}
	return t, nil
}
