package latchlocal

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/testsupport"
)

// sedSub is one sed substitution as getting-started writes them:
// s/old/new/ (the first match of each line) or s/old/new/g (every match).
type sedSub struct {
	old, new string
	global   bool
}

// sed applies subs to each line of the example file f, as
// `sed 's/…/…/; …' examples/f` does.
func sed(t *testing.T, f string, subs ...sedSub) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", f))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		for _, s := range subs {
			n := 1
			if s.global {
				n = -1
			}
			l = strings.Replace(l, s.old, s.new, n)
		}
		lines[i] = l
	}
	return []byte(strings.Join(lines, "\n"))
}

// latchctl runs the latchctl binary (what kubectl latch runs) with args
// against env and returns its standard output and exit code.
func latchctl(t *testing.T, ctx context.Context, env *Env, args ...string) (string, int) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, testsupport.MustBinary(t, "cmd/latchctl"), append(args, "--kubeconfig="+kubeconfig)...)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.String(), exit.ExitCode()
	case err != nil:
		t.Fatalf("latchctl %v: %v", args, err)
	}
	return stdout.String(), 0
}

// checkExplainShown fails the test unless every finding the doc block
// shows (a line and its indented continuation, elided with "..." or "…",
// ages as "N ago") is in latchctl's output, and the block's last line is
// latchctl's summary line.
func checkExplainShown(t *testing.T, doc []string, out string) {
	t.Helper()
	flat := ago.ReplaceAllString(strings.Join(strings.Fields(out), " "), "N ago")
	var finding []string
	check := func() {
		if len(finding) == 0 {
			return
		}
		if f := strings.Join(strings.Fields(strings.Join(finding, " ")), " "); !shownIn(f, flat) {
			t.Errorf("the doc shows\n  %s\nwhich latchctl does not print:\n%s", f, out)
		}
		finding = nil
	}
	for _, l := range doc {
		switch {
		case l == "" || l == "...":
			check()
		case strings.HasPrefix(l, " "):
			finding = append(finding, l)
		default:
			check()
			finding = append(finding, l)
		}
	}
	check()
	outLines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if got, want := outLines[len(outLines)-1], doc[len(doc)-1]; got != want {
		t.Errorf("summary line: latchctl prints %q, the doc shows %q; output:\n%s", got, want, out)
	}
}

// age is a duration as latchctl's tables print it (diagnose.HumanDuration).
var age = regexp.MustCompile(`^\d+(s|m|m\d+s|h|d)$`)

// tableLines normalises a table for comparison: columns by whitespace,
// each age (a whole column, or "(AGE ago)") replaced by AGE.
func tableLines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		f := strings.Fields(l)
		for i, w := range f {
			if age.MatchString(w) || age.MatchString(strings.TrimPrefix(w, "(")) {
				f[i] = strings.Replace(w, strings.TrimPrefix(w, "("), "AGE", 1)
			}
		}
		out = append(out, strings.Join(f, " "))
	}
	return out
}

// getting-started's steps 2 to 5 as a new operator runs them on
// `latch-local up` (real nodes, the default): examples/statefulset.yaml's
// Pods run and `kubectl latch status` lists both volumes attached (exit
// 0), then it is deleted with everything it made; step 3's
// manifests applied and its `auth can-i` answers as shown (their Pods run
// on the hollow nodes, as the doc says); in step 4, app-2's explain
// prints what the doc shows and, after app-1 is deleted,
// app-2's explain finds no problem (exit 0); then a PV of a driver that is
// not installed, and a Pod using it: what `kubectl latch explain pod
// default/app-3` and `kubectl latch status -o wide` print is what the doc
// shows (ages aside), exit codes included; the VolumeAttachment is
// pending; and the kube-controller-manager event the doc quotes for
// 2 minutes later is the text latch's controller records then
// (decide.AttachTimeoutMessage; its timing is TestNoAttacher_… in
// test/interop).
func TestGettingStartedWalk_steps2To5AsTheDocsShow(t *testing.T) {
	logs := &testsupport.SyncBuffer{}
	ctx, env := startEnv(t, 4*time.Minute, Options{Nodes: 2, RealNodes: true, ProcessOutput: logs})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("child processes' log (tail):\n%s", lastLines(logs.String(), 100))
		}
	})
	attachedTo := func(pv, node string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, va := range vas.Items {
				if p := va.Spec.Source.PersistentVolumeName; p != nil && *p == pv && va.Spec.NodeName == node && va.Status.Attached {
					return true, nil
				}
			}
			return false, nil
		}
	}
	running := func(name string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			p, err := env.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == v1.PodRunning, nil
		}
	}

	// Step 2: the StatefulSet, its status, its deletion.
	gettingStartedStatefulSet(t, ctx, env, running)
	// Step 2's smaller examples, step 3, then step 4.
	applyExamples(t, ctx, env)
	testsupport.Eventually(t, ctx, 2*time.Minute, "example-volume attached to node-1", attachedTo("example-volume", "node-1"))
	gettingStartedStep3(t, ctx, env)
	applyManifest(t, ctx, env, "pod.yaml (app-2)", sed(t, "pod.yaml", sedSub{"app-1", "app-2", false}, sedSub{"node-1", "node-2", false}))
	testsupport.Eventually(t, ctx, time.Minute, "the Multi-Attach event on app-2", func(ctx context.Context) (bool, error) {
		evs, err := env.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=app-2,reason=FailedAttachVolume"})
		return err == nil && len(evs.Items) > 0, err
	})
	out, code := latchctl(t, ctx, env, "explain", "pod", "default/app-2")
	if code != 1 {
		t.Errorf("latchctl explain pod default/app-2: exit %d, want 1 (a problem was found, as the doc says)", code)
	}
	checkExplainShown(t, docBlock(t, "kubectl latch explain pod default/app-2\n"), out)
	// kubectl delete pod app-1 (kubectl waits until it is gone).
	if err := env.Client.CoreV1().Pods("default").Delete(ctx, "app-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, 2*time.Minute, "Pod app-1 gone", func(ctx context.Context) (bool, error) {
		_, err := env.Client.CoreV1().Pods("default").Get(ctx, "app-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	testsupport.Eventually(t, ctx, 2*time.Minute, "example-volume attached to node-2", attachedTo("example-volume", "node-2"))
	testsupport.Eventually(t, ctx, 2*time.Minute, "Pod app-2 Running", running("app-2"))
	if out, code := latchctl(t, ctx, env, "explain", "pod", "default/app-2"); code != 0 || !strings.HasSuffix(out, "no problem found\n") {
		t.Errorf("latchctl explain pod default/app-2 after app-1 is gone: exit %d, want 0 and no problem found (as the doc says):\n%s", code, out)
	}

	// Step 5.
	applyManifest(t, ctx, env, "pv-pvc.yaml (other-volume)", sed(t, "pv-pvc.yaml",
		sedSub{"example-volume", "other-volume", true}, sedSub{"mock.csi.latch.dev", "other.csi.example.com", false}))
	applyManifest(t, ctx, env, "pod.yaml (app-3)", sed(t, "pod.yaml", sedSub{"app-1", "app-3", false}, sedSub{"example-volume", "other-volume", false}))
	testsupport.Eventually(t, ctx, time.Minute, "other-volume's VolumeAttachment on node-1", func(ctx context.Context) (bool, error) {
		vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, va := range vas.Items {
			if p := va.Spec.Source.PersistentVolumeName; p != nil && *p == "other-volume" {
				return va.Spec.NodeName == "node-1" && va.Spec.Attacher == "other.csi.example.com", nil
			}
		}
		return false, nil
	})

	out, code = latchctl(t, ctx, env, "explain", "pod", "default/app-3")
	if code != 1 {
		t.Errorf("latchctl explain pod default/app-3: exit %d, want 1 (a problem was found, as the doc says)", code)
	}
	checkExplainShown(t, docBlock(t, "kubectl latch explain pod default/app-3\n"), out)

	out, code = latchctl(t, ctx, env, "status", "-o", "wide")
	if code != 0 {
		t.Errorf("latchctl status -o wide: exit %d, want 0 (status fails only with --fail-pending-older)", code)
	}
	got, want := tableLines(out), tableLines(strings.Join(docBlock(t, "kubectl latch status -o wide\n"), "\n"))
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("latchctl status -o wide prints (ages as AGE)\n  %s\nthe doc shows\n  %s\noutput:\n%s",
			strings.Join(got, "\n  "), strings.Join(want, "\n  "), out)
	}

	// The event the doc quotes, as latch's controller words it.
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	event := decide.AttachTimeoutMessage("other-volume", "other.csi.example.com", "other-volume")
	_, quoted, _ := strings.Cut(event, " : ")
	if flatDoc := strings.Join(strings.Fields(string(doc)), " "); !strings.Contains(flatDoc, "`... "+quoted+"`") {
		t.Errorf("docs/getting-started.md step 5 does not quote the attach timeout event as latch records it: `... %s`", quoted)
	}
}

// gettingStartedStatefulSet is step 2's first half: examples/statefulset.yaml
// applied, both replicas Running, `kubectl latch status` listing both
// volumes attached, then `kubectl delete -f` taking it all down (claims,
// Pods and VolumeAttachments gone).
func gettingStartedStatefulSet(t *testing.T, ctx context.Context, env *Env, running func(string) func(context.Context) (bool, error)) {
	t.Helper()
	m := readManifest(t, env.Cluster.RESTConfig(), filepath.Join("..", "..", "examples", "statefulset.yaml"))
	m.create(t, ctx)
	for _, pod := range []string{"web-0", "web-1"} {
		testsupport.Eventually(t, ctx, 2*time.Minute, "StatefulSet Pod "+pod+" Running", running(pod))
	}
	out, code := latchctl(t, ctx, env, "status")
	var attached []string
	for _, l := range tableLines(out)[1:] {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "attached" {
			attached = append(attached, f[3])
		}
	}
	if code != 0 || len(attached) != 2 || !strings.HasPrefix(out, "NAME ") {
		t.Errorf("latchctl status with the StatefulSet Running: exit %d, volumes attached %q; want exit 0 and both volumes attached, as the doc says:\n%s", code, attached, out)
	}
	m.delete(t, ctx)
	testsupport.Eventually(t, ctx, 2*time.Minute, "everything of examples/statefulset.yaml gone, with its claims and VolumeAttachments", func(ctx context.Context) (bool, error) {
		if ok, _ := m.gone(t, ctx); !ok {
			return false, nil
		}
		pvcs, err := env.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		return err == nil && len(pvcs.Items) == 0 && len(vas.Items) == 0, err
	})
}
