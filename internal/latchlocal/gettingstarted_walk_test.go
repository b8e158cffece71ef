package latchlocal

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/testsupport"
)

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

// gsSections are the headings of getting-started's steps the walk runs.
var gsSections = []string{
	"## 1. Build and start latch-local",
	"## 2. Attach volumes",
	"## 3. Apply the deployment manifests",
	"## 4. Diagnose a stuck attachment: Multi-Attach",
	"## 5. Diagnose a stuck attachment: no attacher for the driver",
}

// gsStep is one command of the walk: skip says why the test does not run
// it; before waits for what the page says has happened by then; exit is
// the exit status the page gives; check looks at what it printed (shown:
// the output block after its block, for the block's last command).
type gsStep struct {
	command string
	skip    string
	before  func()
	exit    int
	check   func(out string, shown []string)
}

// normCommand is a command with runs of spaces as one (the page aligns
// its comments).
func normCommand(c string) string { return strings.Join(strings.Fields(c), " ") }

// getting-started's steps 1 to 5 as a new operator runs them on
// `latch-local up` (real nodes, the default): every command of their
// ```sh blocks, as written and in order, in bash, with kubectl and
// `kubectl latch` (latchctl, through kubectl's plugin lookup) on PATH as
// the page exports it; only `git clone`, `make build` (bin/ is prepared
// from the same builds) and `bin/latch-local up` (started in-process, to
// reach the driver) are not run by the shell. Between the commands the
// test waits for what the page says has happened by then (the
// StatefulSet's Pods Running, a volume attached, the Multi-Attach event),
// and checks what each command prints against the page: `kubectl get`
// lists the nodes, the VolumeAttachment and the Deployments; `kubectl
// latch status` both StatefulSet volumes attached, with exit 0; `kubectl
// delete -f` takes the StatefulSet down with its claims and
// VolumeAttachments; each `auth can-i` answers (and exits) as its comment
// says; explain's and status's outputs are the output blocks shown (ages
// and elided parts aside), exit codes included. The kube-controller-manager
// event step 5 quotes for 2 minutes later is the text latch's controller
// records then (decide.AttachTimeoutMessage; its timing is
// TestNoAttacher_… in test/interop).
func TestGettingStartedWalk_steps1To5AsWritten(t *testing.T) {
	logs := &testsupport.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("child processes' log (tail):\n%s", lastLines(logs.String(), 100))
		}
	})
	sh := newShell(t, t.Context())
	var (
		ctx context.Context
		env *Env
	)
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
	lists := func(what string, want ...string) func(string, []string) {
		return func(out string, _ []string) {
			flat := strings.Join(tableLines(out), "\n")
			for _, w := range want {
				if !strings.Contains(flat, w) {
					t.Errorf("%s: %q is not in what it prints:\n%s", what, w, out)
				}
			}
		}
	}
	explainShown := func(out string, shown []string) { checkExplainShown(t, shown, out) }
	canI := func(command string) gsStep {
		c := parseCanI(t, command)
		exit := 0
		if !c.want {
			exit = 1 // kubectl auth can-i exits 1 when the answer is no
		}
		return gsStep{command: command, exit: exit,
			before: func() { waitCanI(t, ctx, env, c) },
			check: func(out string, _ []string) {
				if want := map[bool]string{true: "yes", false: "no"}[c.want]; strings.TrimSpace(out) != want {
					t.Errorf("`%s` prints %q, want %q", command, out, want)
				}
			}}
	}

	walk := []gsStep{
		{command: "git clone https://github.com/latchcsi/latch && cd latch", skip: "the test runs in the checkout"},
		{command: "make build # bin/: every binary, plus bin/kubectl-latch (the kubectl plugin) and bin/kubectl_complete-latch (its completion)",
			skip: "bin/ is prepared from the same builds (TestKubectlCompletesTheLatchPluginThroughItsCompleter checks what make build installs)"},
		{command: "bin/latch-local up # or: make up", skip: "started in-process, to reach the mock driver (TestUpServesKubeconfigAndStopsCleanlyOnCtrlC runs the command)"},
		{command: "export KUBECONFIG=$PWD/latch-local.kubeconfig"},
		{command: "export PATH=$PWD/bin:$PATH # so that kubectl finds the kubectl-latch plugin"},
		{command: "kubectl get nodes", check: lists("kubectl get nodes", "node-1 Ready", "node-2 Ready")},
		// 2.
		{command: "kubectl apply -f examples/statefulset.yaml"},
		{command: "kubectl get pods,pvc,volumeattachments -o wide", before: func() {
			// A snapshot: by the time one looks, the StatefulSet
			// controller has made the Pods and claims.
			testsupport.Eventually(t, ctx, time.Minute, "the StatefulSet's Pods and claims made", func(ctx context.Context) (bool, error) {
				pods, err := env.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
				if err != nil {
					return false, err
				}
				pvcs, err := env.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
				return err == nil && len(pods.Items) == 2 && len(pvcs.Items) == 2, err
			})
		}, check: lists("kubectl get pods,pvc,volumeattachments", "pod/web-0", "pod/web-1", "persistentvolumeclaim/data-web-0", "persistentvolumeclaim/data-web-1")},
		{command: "kubectl latch status # same as: latchctl status", before: func() {
			for _, pod := range []string{"web-0", "web-1"} {
				testsupport.Eventually(t, ctx, 2*time.Minute, "StatefulSet Pod "+pod+" Running", running(pod))
			}
		}, check: func(out string, _ []string) {
			var attached []string
			for _, l := range tableLines(out)[1:] {
				if f := strings.Fields(l); len(f) > 4 && f[4] == "attached" {
					attached = append(attached, f[3])
				}
			}
			slices.Sort(attached)
			if !slices.Equal(attached, []string{"web-data-1", "web-data-2"}) || !strings.HasPrefix(out, "NAME ") {
				t.Errorf("kubectl latch status with the StatefulSet Running lists %q attached; want both volumes, as the page says:\n%s", attached, out)
			}
		}},
		{command: "kubectl delete -f examples/statefulset.yaml", check: func(string, []string) {
			testsupport.Eventually(t, ctx, 2*time.Minute, "the StatefulSet's claims and VolumeAttachments gone", func(ctx context.Context) (bool, error) {
				pvcs, err := env.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, err
				}
				vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
				return err == nil && len(pvcs.Items) == 0 && len(vas.Items) == 0, err
			})
		}},
		{command: "kubectl apply -f examples/pv-pvc.yaml -f examples/pod.yaml"},
		{command: "kubectl get volumeattachments", before: func() {
			testsupport.Eventually(t, ctx, 2*time.Minute, "example-volume attached to node-1", attachedTo("example-volume", "node-1"))
		}, check: lists("kubectl get volumeattachments", "mock.csi.latch.dev example-volume node-1 true")},
		// 3.
		{command: "kubectl apply -k deploy/overlays/prometheus-scrape # the controller, with scrape annotations"},
		{command: "kubectl apply -k deploy/examples/mock-driver # the example driver with csi-attacher"},
		{command: "kubectl get deployments -A", before: func() { waitDeploymentsRunning(t, ctx, env) },
			check: lists("kubectl get deployments -A", "kube-system latch-attachdetach-controller", "latch-system csi-mock-controller")},
	}
	// The three can-i lines, as the page writes them.
	var docs []string
	for _, sec := range gsSections {
		for _, st := range docShellSteps(t, "docs/getting-started.md", sec) {
			for _, c := range st.commands {
				docs = append(docs, normCommand(c))
				if strings.HasPrefix(c, "kubectl auth can-i ") {
					walk = append(walk, canI(normCommand(c)))
				}
			}
		}
	}
	walk = append(walk,
		// 4.
		gsStep{command: "sed 's/app-1/app-2/; s/node-1/node-2/' examples/pod.yaml | kubectl apply -f -"},
		gsStep{command: "kubectl latch explain pod default/app-2", exit: 1, check: explainShown, before: func() {
			testsupport.Eventually(t, ctx, time.Minute, "the Multi-Attach event on app-2", func(ctx context.Context) (bool, error) {
				evs, err := env.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=app-2,reason=FailedAttachVolume"})
				return err == nil && len(evs.Items) > 0, err
			})
		}},
		gsStep{command: "kubectl delete pod app-1", check: func(string, []string) {
			testsupport.Eventually(t, ctx, 2*time.Minute, "example-volume attached to node-2", attachedTo("example-volume", "node-2"))
			testsupport.Eventually(t, ctx, 2*time.Minute, "Pod app-2 Running", running("app-2"))
		}},
		gsStep{command: "kubectl latch explain pod default/app-2 # no problem found, exit code 0", check: func(out string, _ []string) {
			if !strings.HasSuffix(out, "no problem found\n") {
				t.Errorf("kubectl latch explain pod default/app-2 after app-1 is gone: want no problem found (as the page says):\n%s", out)
			}
		}},
		// 5.
		gsStep{command: "sed 's/example-volume/other-volume/g; s/mock.csi.latch.dev/other.csi.example.com/' examples/pv-pvc.yaml | kubectl apply -f -"},
		gsStep{command: "sed 's/app-1/app-3/; s/example-volume/other-volume/' examples/pod.yaml | kubectl apply -f -"},
		gsStep{command: "kubectl latch explain pod default/app-3", exit: 1, check: explainShown, before: func() {
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
		}},
		gsStep{command: "kubectl latch status -o wide", check: func(out string, shown []string) {
			got, want := tableLines(out), tableLines(strings.Join(shown, "\n"))
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("kubectl latch status -o wide prints (ages as AGE)\n  %s\nthe page shows\n  %s\noutput:\n%s",
					strings.Join(got, "\n  "), strings.Join(want, "\n  "), out)
			}
		}},
	)
	var walked []string
	for _, s := range walk {
		walked = append(walked, s.command)
	}
	if !slices.Equal(docs, walked) {
		t.Fatalf("docs/getting-started.md's steps 1 to 5 run\n  %s\nthe test walks\n  %s\n(change the page and the test together)", strings.Join(docs, "\n  "), strings.Join(walked, "\n  "))
	}

	i := 0
	for _, sec := range gsSections {
		for _, st := range docShellSteps(t, "docs/getting-started.md", sec) {
			for k := range st.commands {
				w := walk[i]
				i++
				if w.command == "bin/latch-local up # or: make up" {
					ctx, env = startEnv(t, 6*time.Minute, Options{Nodes: 2, RealNodes: true, ProcessOutput: logs,
						Kubeconfig: filepath.Join(sh.dir, "latch-local.kubeconfig")})
					sh.ctx = ctx
					continue
				}
				if w.skip != "" {
					t.Logf("not run: `%s`: %s", w.command, w.skip)
					continue
				}
				if w.before != nil {
					w.before()
				}
				out, errOut, err := sh.try(w.command)
				if code := exitCode(err); code != w.exit {
					t.Fatalf("`%s`: exit %d (%v), want %d as the page says\nstdout:\n%s\nstderr:\n%s", w.command, code, err, w.exit, out, errOut)
				}
				if strings.HasPrefix(w.command, "export ") {
					sh.exports = append(sh.exports, w.command)
				}
				var shown []string
				if k == len(st.commands)-1 {
					shown = st.output
				}
				if w.check != nil {
					w.check(out, shown)
				}
				if t.Failed() {
					t.Fatalf("stopped after `%s`", w.command)
				}
			}
		}
	}

	// The event the page quotes, as latch's controller words it.
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

// exitCode is a command's exit status (-1 when it did not run).
func exitCode(err error) int {
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		return -1
	}
	return 0
}
