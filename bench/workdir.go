package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/localcluster"
)

// What the benchmark commands (cmd/latch-bench, cmd/latch-scale) share:
// the work directory, the control plane's log, the components' build and
// the control plane itself.

// PrepareWorkDir returns dir, created if missing, or a new temporary
// directory named after prefix when dir is empty, and prints its path.
func PrepareWorkDir(dir, prefix string) (string, error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", prefix)
		if err != nil {
			return "", err
		}
		dir = tmp
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	fmt.Printf("work directory (binaries, kubeconfig, logs): %s\n", dir)
	return dir, nil
}

// LogTo sends klog (the API server and in-process components) to w, and
// nothing to stderr, at verbosity.
func LogTo(w io.Writer, verbosity string) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL", "v": verbosity} {
		if err := fs.Set(k, v); err != nil {
			return err
		}
	}
	klog.SetOutput(w)
	return nil
}

// BuildComponents builds pkgs (e.g. ./cmd/csi-attacher) into binDir as
// the images build them (build/Dockerfile): static, with the grpcnotrace
// tag, which keeps csi-attacher's binary (and its resident code pages)
// small.
func BuildComponents(ctx context.Context, binDir string, pkgs ...string) error {
	fmt.Printf("building %s\n", strings.Join(pkgs, " "))
	build := exec.CommandContext(ctx, "go", append([]string{"build", "-tags", "grpcnotrace", "-o", binDir + "/"}, pkgs...)...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build the components: %w", err)
	}
	return nil
}

// StartControlPlane starts etcd and the API server, etcd logging to
// etcd.log in workDir, and gives them two minutes to come up.
func StartControlPlane(ctx context.Context, workDir string) (*localcluster.Cluster, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return localcluster.Start(ctx, localcluster.Options{EtcdLogOutput: filepath.Join(workDir, "etcd.log")})
}
