package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The tests start the real process: the test binary run as the command,
// so it can be signalled.
func TestMain(m *testing.M) { testsupport.RunTestMainAsCommand(m, main) }

// `latch-local up` as a person uses it: it writes a kubeconfig, the
// examples applied through it get their Pod running (pod.yaml on its named
// node; statefulset.yaml scheduled, bound and mounted by the real
// scheduler, kube-controller-manager and kubelets, then deleted with every
// volume detached), each controller serves its own metrics where it says,
// and Ctrl-C (SIGINT) stops every component and the API server, exiting 0.
func TestUpServesKubeconfigAndStopsCleanlyOnCtrlC(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	attacherMetrics, controllerMetrics := testsupport.FreeAddr(t), testsupport.FreeAddr(t)
	cmd := testsupport.Command("up", "--kubeconfig", kubeconfig, "--log-file", filepath.Join(dir, "latch-local.log"),
		"--metrics-ports", port(t, attacherMetrics)+","+port(t, controllerMetrics))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdoutPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var stdout bytes.Buffer
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdoutPipe)
		signalled := false
		for sc.Scan() {
			stdout.WriteString(sc.Text() + "\n")
			if !signalled && strings.Contains(sc.Text(), "Press Ctrl-C") {
				signalled = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdoutPipe)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("latch-local up exited before it was ready: %v\nstderr:\n%s", err, stderr.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("latch-local up not ready after 3 minutes\nstderr:\n%s", stderr.String())
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("the kubeconfig latch-local wrote does not load: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 2 {
		t.Fatalf("nodes through the kubeconfig: %d, err %v; want the 2 simulated nodes", len(nodes.Items), err)
	}

	// What the printed instructions say to do: apply examples/, watch the
	// Pod start once its volume is attached.
	applyManifests(t, ctx, dynamic.NewForConfigOrDie(cfg), "../../examples/pv-pvc.yaml", "../../examples/pod.yaml")
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, "app-1", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, nil
	}); err != nil {
		t.Fatalf("example Pod app-1 did not reach Running: %v", err)
	}
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil || len(vas.Items) != 1 || !vas.Items[0].Status.Attached {
		t.Fatalf("VolumeAttachments after the example Pod started: %+v, err %v; want one, attached", vas, err)
	}
	checkMetricsEndpoints(t, ctx, attacherMetrics, controllerMetrics)

	// The instructions printed for the real nodes: the StatefulSet
	// example runs (the scheduler places it, kube-controller-manager
	// binds its claims), and `kubectl delete -f` takes it all down.
	dyn := dynamic.NewForConfigOrDie(cfg)
	applyManifests(t, ctx, dyn, "../../examples/statefulset.yaml")
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range []string{"web-0", "web-1"} {
			p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != v1.PodRunning || p.Spec.NodeName == "" {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("StatefulSet web of examples/statefulset.yaml not Running: %v", err)
	}
	if attached := attachedVolumes(t, ctx, client); !reflect.DeepEqual(attached, []string{"example-volume", "web-data-1", "web-data-2"}) {
		t.Errorf("attached volumes with the StatefulSet Running: %v, want example-volume, web-data-1, web-data-2", attached)
	}
	deleteManifests(t, ctx, dyn, "../../examples/statefulset.yaml")
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pvcs, err := client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return len(pvs.Items) == 1 && len(pvcs.Items) == 1 && reflect.DeepEqual(attachedVolumes(t, ctx, client), []string{"example-volume"}), nil
	}); err != nil {
		t.Fatalf("after kubectl delete -f examples/statefulset.yaml: attached %v; want only example-volume attached and its PV and claim the only ones left: %v", attachedVolumes(t, ctx, client), err)
	}

	// Ctrl-C.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("latch-local up exited with %v after Ctrl-C, want 0\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("latch-local up still running a minute after Ctrl-C\nstdout:\n%s", stdout.String())
	}
	if !strings.Contains(stdout.String(), "kubectl apply -f examples/statefulset.yaml") {
		t.Errorf("the printed instructions do not name examples/statefulset.yaml:\n%s", stdout.String())
	}
	if !strings.Contains(stdout.String(), "Stopping") {
		t.Errorf("stdout does not say it is stopping:\n%s", stdout.String())
	}
	checkMetricsPrinted(t, stdout.String(), attacherMetrics, controllerMetrics)
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		conn.Close()
		t.Errorf("the API server address %s still accepts connections after teardown", u.Host)
	}
}

// applyManifests creates every object in the given YAML files, as
// `kubectl create -f` would.
func applyManifests(t *testing.T, ctx context.Context, dyn dynamic.Interface, files ...string) {
	t.Helper()
	manifests(t, ctx, dyn, false, files...)
}

// deleteManifests deletes every object in the given YAML files, as
// `kubectl delete -f --wait=false` would.
func deleteManifests(t *testing.T, ctx context.Context, dyn dynamic.Interface, files ...string) {
	t.Helper()
	manifests(t, ctx, dyn, true, files...)
}

func manifests(t *testing.T, ctx context.Context, dyn dynamic.Interface, del bool, files ...string) {
	t.Helper()
	resources := map[string]schema.GroupVersionResource{
		"PersistentVolume":      {Version: "v1", Resource: "persistentvolumes"},
		"PersistentVolumeClaim": {Version: "v1", Resource: "persistentvolumeclaims"},
		"Pod":                   {Version: "v1", Resource: "pods"},
		"Service":               {Version: "v1", Resource: "services"},
		"StorageClass":          {Group: "storage.k8s.io", Version: "v1", Resource: "storageclasses"},
		"StatefulSet":           {Group: "apps", Version: "v1", Resource: "statefulsets"},
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); err != nil {
				if err == io.EOF {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if obj.Object == nil {
				continue
			}
			gvr, ok := resources[obj.GetKind()]
			if !ok {
				t.Fatalf("%s: unexpected kind %q", f, obj.GetKind())
			}
			var ri dynamic.ResourceInterface = dyn.Resource(gvr)
			if obj.GetKind() != "PersistentVolume" && obj.GetKind() != "StorageClass" {
				ns := obj.GetNamespace()
				if ns == "" {
					ns = "default"
				}
				ri = dyn.Resource(gvr).Namespace(ns)
			}
			if del {
				bg := metav1.DeletePropagationBackground
				if err := ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
					t.Fatalf("delete %s %s from %s: %v", obj.GetKind(), obj.GetName(), f, err)
				}
			} else if _, err := ri.Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create %s %s from %s: %v", obj.GetKind(), obj.GetName(), f, err)
			}
		}
	}
}

// The README's first command exactly as written (`latch-local demo`, no
// flags), as a child process whose stdout is not a terminal: exit 0, every
// phase and the summary printed, no colour codes in the output.
func TestDemoCommandAsTheReadmeRunsIt(t *testing.T) {
	cmd := testsupport.Command("demo")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("latch-local demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"ATTACH", "MULTI-ATTACH", "DETACH", "SUMMARY", "ControllerPublishVolume", "Demo finished: every step happened in order."} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("demo output to a non-terminal carries ANSI escape codes:\n%q", out)
	}
}

// attachedVolumes are the PVs of the VolumeAttachments that exist, sorted.
func attachedVolumes(t *testing.T, ctx context.Context, client kubernetes.Interface) []string {
	t.Helper()
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list VolumeAttachments: %v", err)
	}
	var pvs []string
	for _, va := range vas.Items {
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
			pvs = append(pvs, *pv)
		}
	}
	sort.Strings(pvs)
	return pvs
}
