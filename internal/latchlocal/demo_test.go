package latchlocal

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"
)

// The README's first command runs this demo; the test runs the same code
// in-process and checks that every milestone happened, in order.
func TestDemoWalksAttachConflictAndDetachInOrder(t *testing.T) {
	ctx, env := startEnv(t, 3*time.Minute, Options{Nodes: 2})
	r, got := runDemo(t, ctx, env)
	want := []string{
		"attach: PV and PVC created",
		"attach: Pod app-1 created",
		"attach: VolumeAttachment created",
		"attach: ControllerPublishVolume succeeded",
		"attach: VolumeAttachment attached",
		"attach: node status updated",
		"attach: Pod Running",
		"multi-attach: Pod app-2 created",
		"multi-attach: Multi-Attach error reported on app-2",
		"multi-attach: no publish to node-2 while node-1 holds the volume",
		"detach: Pod app-1 deleted",
		"detach: kubelet released the volume (volumesInUse)",
		"detach: ControllerUnpublishVolume succeeded",
		"detach: VolumeAttachment deleted",
		"detach: node status updated",
		"conflict resolved: VolumeAttachment created",
		"conflict resolved: ControllerPublishVolume succeeded",
		"conflict resolved: VolumeAttachment attached",
		"conflict resolved: node status updated",
		"conflict resolved: Pod Running",
		"cleanup: Pod app-2 deleted",
		"cleanup: VolumeAttachment deleted",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("steps:\n%q\nwant:\n%q", got, want)
	}
	for i := 1; i < len(r.Steps); i++ {
		if r.Steps[i].At < r.Steps[i-1].At {
			t.Errorf("step %q observed before the step before it", r.Steps[i].Name)
		}
	}
	// Exactly one publish per node: the conflict never reached the driver.
	if n := len(env.Driver.CallsTo("ControllerPublishVolume")); n != 2 {
		t.Errorf("ControllerPublish calls = %d, want 2 (node-1, then node-2 after the release)", n)
	}
	if v := env.Driver.Stats().Publish.SingleNodeConflictAttemptsTotal; v != 0 {
		t.Errorf("driver saw %d attempts to publish the RWO volume to a second node", v)
	}

	// `up` mode: the manifests in examples/, applied as kubectl would,
	// get their Pod running (kube-controller-manager's PV binder binds the
	// pre-bound claim).
	applyExamples(t, ctx, env)
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := env.Client.CoreV1().Pods("default").Get(ctx, "app-1", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, nil
	}); err != nil {
		t.Fatalf("example Pod app-1 not Running: %v", err)
	}
	if got := env.Driver.Published("example-volume"); !slices.Equal(got, []string{NodeID(1)}) {
		t.Errorf("example volume published to %v, want [%s]", got, NodeID(1))
	}
	// Bound by kube-controller-manager's PV binder, as in a cluster: it
	// writes the bind-completed annotation latch has no code for.
	pvc, err := env.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "example-volume", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != v1.ClaimBound || pvc.Annotations["pv.kubernetes.io/bind-completed"] != "yes" {
		t.Errorf("claim example-volume: phase %s, annotations %v; want Bound by the PV controller (pv.kubernetes.io/bind-completed)", pvc.Status.Phase, pvc.Annotations)
	}
}

func applyExamples(t *testing.T, ctx context.Context, env *Env) {
	t.Helper()
	for _, f := range []string{"pv-pvc.yaml", "pod.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		applyManifest(t, ctx, env, f, data)
	}
}

// applyManifest creates the PVs, PVCs and Pods of data (YAML, named f).
func applyManifest(t *testing.T, ctx context.Context, env *Env, f string, data []byte) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			break
		}
		if raw == nil {
			continue
		}
		b, _ := yaml.Marshal(raw)
		var err error
		switch raw["kind"] {
		case "PersistentVolume":
			var o v1.PersistentVolume
			_ = yaml.Unmarshal(b, &o)
			_, err = env.Client.CoreV1().PersistentVolumes().Create(ctx, &o, metav1.CreateOptions{})
		case "PersistentVolumeClaim":
			var o v1.PersistentVolumeClaim
			_ = yaml.Unmarshal(b, &o)
			_, err = env.Client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		case "Pod":
			var o v1.Pod
			_ = yaml.Unmarshal(b, &o)
			_, err = env.Client.CoreV1().Pods(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected kind %v in %s", raw["kind"], f)
		}
		if err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
	}
}

// startEnv starts an environment with o for a test that may take up to
// timeout; it is stopped when the test ends.
func startEnv(t *testing.T, timeout time.Duration, o Options) (context.Context, *Env) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancel)
	env, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(env.Stop)
	return ctx, env
}

// runDemo runs the demo on env, ends the test if it failed (with the
// driver's calls), and returns its result and its steps as "phase: name".
func runDemo(t *testing.T, ctx context.Context, env *Env) (Result, []string) {
	t.Helper()
	r := RunDemo(ctx, env, nopReporter{})
	if !r.OK {
		t.Fatalf("demo failed at %q: %s\ncalls:\n%s", r.FailedStep, r.Error, calls(env.Driver.Calls()))
	}
	var steps []string
	for _, s := range r.Steps {
		steps = append(steps, s.Phase+": "+s.Name)
	}
	return r, steps
}

type nopReporter struct{}

func (nopReporter) Phase(string)   {}
func (nopReporter) Waiting(string) {}
func (nopReporter) Step(Step)      {}
