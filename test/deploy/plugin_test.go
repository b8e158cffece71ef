package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pluginDir holds latchctl installed as kubectl-latch, the way `make
// build` installs it into bin/.
func pluginDir(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(binaries(t), "latchctl"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kubectl-latch"), raw, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// failingVA creates a VolumeAttachment of a driver no attacher serves,
// with an attach error.
func failingVA(ctx context.Context, t *testing.T, driver, message string) string {
	t.Helper()
	pv := "plugin-pv"
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-va"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: "plugin-node",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	client := cluster.Client().StorageV1().VolumeAttachments()
	created, err := client.Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.AttachError = &storagev1.VolumeError{Time: metav1.Now(), Message: message}
	if _, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return created.Name
}

type statusDoc struct {
	Items []struct{ Name, Driver, State, Error string }
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestLatchctlRunsAsKubectlPlugin(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const driver = "plugin.csi.latch.dev"
	vaName := failingVA(ctx, t, driver, "backend quota exceeded")
	dir := pluginDir(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))

	checkStatus := func(t *testing.T, cmd *exec.Cmd) {
		t.Helper()
		if cmd.Env == nil {
			cmd.Env = env
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d (%v), want 1 (a failing attachment); stderr:\n%s", code, err, stderr.String())
		}
		var doc statusDoc
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		if len(doc.Items) != 1 || doc.Items[0].Name != vaName || doc.Items[0].State != "failing" || doc.Items[0].Error != "backend quota exceeded" {
			t.Errorf("status items = %+v, want %s failing with the attach error", doc.Items, vaName)
		}
	}

	t.Run("kubectl-latch binary: usage names kubectl latch", func(t *testing.T) {
		cmd := exec.CommandContext(ctx, filepath.Join(dir, "kubectl-latch"), "--help")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl-latch --help: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "kubectl latch explain pod") || strings.Contains(string(out), "latchctl explain") {
			t.Errorf("usage of kubectl-latch does not speak of `kubectl latch`:\n%s", out)
		}
		checkStatus(t, exec.CommandContext(ctx, filepath.Join(dir, "kubectl-latch"), "status", "-o", "json", "--driver", driver))
	})

	t.Run("kubectl latch through kubectl's plugin mechanism", func(t *testing.T) {
		// This test binary runs kubectl's own command (k8s.io/kubectl, the
		// same minor as our client), so the plugin lookup is kubectl's real
		// one whether or not a kubectl is installed.
		kubectl := os.Args[0]
		env := append(env, runAsKubectl+"=1")
		list := exec.CommandContext(ctx, kubectl, "plugin", "list")
		list.Env = env
		out, _ := list.CombinedOutput()
		if !strings.Contains(string(out), filepath.Join(dir, "kubectl-latch")) {
			t.Errorf("kubectl plugin list does not show kubectl-latch:\n%s", out)
		}
		viaKubectl := exec.CommandContext(ctx, kubectl, "latch", "status", "-o", "json", "--driver", driver)
		viaKubectl.Env = env
		checkStatus(t, viaKubectl)
	})
}
