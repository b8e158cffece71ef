package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// Each test builds one stuck situation on the real API server and checks
// that `latchctl explain` names its cause, with the documented exit code.

func TestExplainPodWithUnboundPVCWaitsAndNamesThePVC(t *testing.T) {
	f := newFixture(t, "unbound")
	node := f.node("a", true)
	claim := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "pending-data"},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resourceOneGi()}}},
	}
	if _, err := f.client.CoreV1().PersistentVolumeClaims(f.ns).Create(f.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.pod("app", node, "pending-data")

	out, code := f.latchctl("explain", "pod", f.ns+"/app")
	if code != exitHealthy {
		t.Errorf("exit code %d, want %d (waiting is not a problem)", code, exitHealthy)
	}
	mustLine(t, out, "OK", "scheduled to node "+node)
	mustLine(t, out, "WAITING", "PersistentVolumeClaim "+f.ns+"/pending-data", "Pending")
	mustSay(t, out, "kubectl describe pvc -n "+f.ns+" pending-data")

	// -n and the kind/name form reach the same Pod.
	out2, _ := f.latchctl("explain", "pod/app", "-n", f.ns)
	if out2 != out {
		t.Errorf("`explain pod/app -n %s` differs from `explain pod %s/app`", f.ns, f.ns)
	}
}

func TestExplainAttachErrorIsAProblemWithTheDriversMessage(t *testing.T) {
	f := newFixture(t, "atterr")
	node, pv := f.appOnNode(true)
	code9 := int32(9)
	f.va(pv, node, storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{
		Time: metav1.NewTime(time.Now().Add(-2 * time.Minute)), Message: "rpc error: code = FailedPrecondition desc = volume is busy", ErrorCode: &code9}})
	f.lease("kube-system", time.Second)

	out, code := f.latchctl("explain", "pod", "app", "-n", f.ns)
	if code != exitProblem {
		t.Errorf("exit code %d, want %d", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "VolumeAttachment "+kubenames.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, f.driver, node), "volume is busy", "gRPC code 9")
	mustSay(t, out, "attached to another node in the backend")
	mustLine(t, out, "OK", "csi-attacher of driver "+f.driver+" runs", "kube-system")

	// JSON carries the same finding under a stable check name.
	out, _ = f.latchctl("explain", "pvc", f.ns+"/"+pv.Name, "-o", "json")
	var doc struct {
		Healthy  bool
		Findings []struct{ Check, Status, Message string }
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, fd := range doc.Findings {
		found = found || (fd.Check == "va.attachError" && fd.Status == "problem")
	}
	if doc.Healthy || !found {
		t.Errorf("JSON report: healthy=%v, va.attachError problem found=%v", doc.Healthy, found)
	}
}

func TestExplainPVTerminatingHeldByAttacherFinalizerNamesTheVA(t *testing.T) {
	f := newFixture(t, "pvterm")
	node := f.node("a", true)
	pv := f.volume("data")
	va := f.va(pv, node, storagev1.VolumeAttachmentStatus{Attached: true})
	patch := []byte(`{"metadata":{"finalizers":["` + kubenames.AttacherFinalizer(f.driver) + `"]}}`)
	if _, err := f.client.CoreV1().PersistentVolumes().Patch(f.ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.client.CoreV1().PersistentVolumes().Delete(f.ctx, pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = f.client.CoreV1().PersistentVolumes().Patch(f.ctx, pv.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})

	out, code := f.latchctl("explain", "pv", pv.Name)
	if code != exitProblem {
		t.Errorf("exit code %d, want %d", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "Terminating", kubenames.AttacherFinalizer(f.driver), va.Name, "node "+node)
}

func TestExplainCSINodeWithoutTheDriver(t *testing.T) {
	f := newFixture(t, "csinode")
	node, pv := f.appOnNode(false)
	f.va(pv, node, storagev1.VolumeAttachmentStatus{})

	out, code := f.latchctl("explain", "pod", f.ns+"/app")
	if code != exitProblem {
		t.Errorf("exit code %d, want %d", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "CSINode "+node, "does not list driver "+f.driver)
	mustLine(t, out, "WAITING", "not attached yet")
}

func TestExplainStaleAttacherLease(t *testing.T) {
	f := newFixture(t, "stale")
	node, pv := f.appOnNode(true)
	f.va(pv, node, storagev1.VolumeAttachmentStatus{})
	f.lease(f.ns, 10*time.Minute) // the attacher's namespace is searched, wherever it is

	out, code := f.latchctl("explain", "va", kubenames.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, f.driver, node)[:24])
	if code != exitProblem {
		t.Errorf("exit code %d, want %d", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "Lease "+f.ns+"/"+kube.LeaseName(f.driver), "stale", "csi-attacher-0", "10m")
}

func TestExplainMultiAttachNamesTheConflictingPodAndNode(t *testing.T) {
	f := newFixture(t, "multi")
	nodeA, nodeB := f.node("a", true), f.node("b", true)
	pv := f.volume("data", v1.ReadWriteOnce)
	f.pod("first", nodeA, pv.Name)
	f.va(pv, nodeA, storagev1.VolumeAttachmentStatus{Attached: true})
	f.nodeVolumes(nodeA, pv, true, true)
	f.pod("second", nodeB, pv.Name)

	out, code := f.latchctl("explain", "pod", f.ns+"/second")
	if code != exitProblem {
		t.Errorf("exit code %d, want %d", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "Multi-Attach", "ReadWriteOnce", "node "+nodeA, "Pod "+f.ns+"/first on node "+nodeA)

	// The Pod that holds the volume is fine.
	if out, code := f.latchctl("explain", "pod", f.ns+"/first"); code != exitHealthy || line(out, "PROBLEM") != "" {
		t.Errorf("explain of the Pod holding the volume: exit %d", code)
	}
}

func TestExplainOutOfServiceTaint(t *testing.T) {
	f := newFixture(t, "oos")
	node, pv := f.appOnNode(true)
	f.va(pv, node, storagev1.VolumeAttachmentStatus{Attached: true})
	if err := f.kubelet.Taint(f.ctx, node, v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}); err != nil {
		t.Fatal(err)
	}
	if err := f.kubelet.SetReady(f.ctx, node, false); err != nil {
		t.Fatal(err)
	}

	out, code := f.latchctl("explain", "pod", f.ns+"/app")
	if code != exitProblem {
		t.Errorf("exit code %d, want %d", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "Node "+node, kubenames.OutOfServiceTaintKey, f.ns+"/app")
	mustLine(t, out, "PROBLEM", "Node "+node, "not Ready")
}

func TestExplainDetachWaitsWhileTheVolumeIsInUse(t *testing.T) {
	f := newFixture(t, "inuse")
	node := f.node("a", true)
	pv := f.volume("data")
	va := f.va(pv, node, storagev1.VolumeAttachmentStatus{Attached: true})
	f.nodeVolumes(node, pv, true, true)
	if err := f.client.StorageV1().VolumeAttachments().Delete(f.ctx, va.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	out, code := f.latchctl("explain", "va", va.Name)
	if code != exitHealthy {
		t.Errorf("exit code %d, want %d (a detach waiting for unmount is not broken)", code, exitHealthy)
	}
	mustLine(t, out, "WAITING", "being deleted", kubenames.AttacherFinalizer(f.driver))
	mustLine(t, out, "WAITING", "still reports", "volumesInUse", kubenames.UniqueVolumeNamePrefix+f.driver)
}

func TestStatusJSON(t *testing.T) {
	f := newFixture(t, "status")
	nodeA, nodeB := f.node("a", true), f.node("b", true)
	attached, failing := f.volume("ok"), f.volume("bad")
	f.va(attached, nodeA, storagev1.VolumeAttachmentStatus{Attached: true})
	f.va(failing, nodeB, storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Time: metav1.Now(), Message: "quota exceeded"}})

	out, code := f.latchctl("status", "-o", "json", "--driver", f.driver, "--sort-by", "node")
	if code != exitProblem {
		t.Errorf("exit code %d, want %d with a failing VolumeAttachment", code, exitProblem)
	}
	var doc struct {
		Items []struct {
			Name, Driver, Node, PersistentVolume, State, Error string
			AgeSeconds                                         int64
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("status -o json is not JSON: %v", err)
	}
	if len(doc.Items) != 2 {
		t.Fatalf("got %d items, want 2 (filtered by --driver)", len(doc.Items))
	}
	a, b := doc.Items[0], doc.Items[1]
	if a.Node != nodeA || a.State != "attached" || a.PersistentVolume != attached.Name || a.Driver != f.driver || a.Error != "" {
		t.Errorf("first row = %+v", a)
	}
	if b.Node != nodeB || b.State != "failing" || b.Error != "quota exceeded" {
		t.Errorf("second row = %+v", b)
	}

	out, _ = f.latchctl("status", "--driver", f.driver)
	mustLine(t, out, "csi-", "failing", "quota exceeded")
}

func TestUsageAndAPIErrorsExitWithTwo(t *testing.T) {
	f := newFixture(t, "usage")
	for _, args := range [][]string{
		{},
		{"explain"},
		{"explain", "deployment", "x"},
		{"explain", "pv", "ns/x"},
		{"explain", "pod", "a/x", "-n", "b"},
		{"status", "--sort-by", "size"},
		{"status", "-o", "text"},
		{"explain", "pod", "x", "--driver", "d"},
		{"frobnicate"},
	} {
		if _, code := f.latchctl(args...); code != exitError {
			t.Errorf("latchctl %q: exit %d, want %d", args, code, exitError)
		}
	}
	// An unreachable API server is an error, not a diagnosis.
	var out, errOut bytesBuffer
	code := run(f.ctx, "latchctl", []string{"--kubeconfig", "/nonexistent/kubeconfig", "status"}, &out, &errOut, time.Now)
	if code != exitError {
		t.Errorf("missing kubeconfig: exit %d, want %d", code, exitError)
	}
	// A missing object is a diagnosis (exit 1), named in the output.
	out2, code := f.latchctl("explain", "pod", f.ns+"/nope")
	if code != exitProblem {
		t.Errorf("missing pod: exit %d, want %d", code, exitProblem)
	}
	mustLine(t, out2, "PROBLEM", f.ns+"/nope", "not found")
}

func TestKubectlPluginNameOnlyChangesUsage(t *testing.T) {
	var out, errOut bytesBuffer
	if code := run(t.Context(), "/usr/local/bin/kubectl-latch", []string{"--help"}, &out, &errOut, time.Now); code != exitHealthy {
		t.Fatalf("--help exit %d", code)
	}
	mustSay(t, errOut.String(), "kubectl latch explain pod")
}

// appOnNode is where most scenarios start: node "a" (its CSINode lists the
// driver when withDriver), volume "data" and Pod "app" using it on node "a".
func (f *fixture) appOnNode(withDriver bool) (node string, pv *v1.PersistentVolume) {
	node = f.node("a", withDriver)
	pv = f.volume("data")
	f.pod("app", node, pv.Name)
	return node, pv
}

// The attach is done (VolumeAttachment attached, the node lists the
// volume) but the kubelet cannot mount it: explain exits 1 with the
// attached-not-mounted verdict, naming the kubelet on the node, and shows
// the Pod's FailedMount event as the kubelet wrote it.
func TestExplainAttachedButNotMountedNamesTheKubeletAndItsFailedMount(t *testing.T) {
	f := newFixture(t, "mount")
	node := f.node("a", true)
	pv := f.volume("data")
	f.pod("web", node, pv.Name)
	va := f.va(pv, node, storagev1.VolumeAttachmentStatus{Attached: true})
	f.nodeVolumes(node, pv, true, true)
	f.lease(f.ns, 0)
	ev := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: f.ns, Name: "web.failedmount"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: f.ns, Name: "web"},
		Type:           v1.EventTypeWarning, Reason: "FailedMount", Count: 4,
		Message:       `MountVolume.MountDevice failed for volume "` + pv.Name + `" : rpc error: code = Internal desc = format of disk failed`,
		Source:        v1.EventSource{Component: "kubelet", Host: node},
		LastTimestamp: metav1.Now(),
	}
	if _, err := f.client.CoreV1().Events(f.ns).Create(f.ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	out, code := f.latchctl("explain", "pod", f.ns+"/web")
	if code != exitProblem {
		t.Errorf("exit code %d, want %d: the Pod cannot start although its volume is attached", code, exitProblem)
	}
	mustLine(t, out, "OK", va.Name, "attached")
	mustLine(t, out, "PROBLEM", "Pod "+f.ns+"/web", "the attach side is done", "the kubelet on node "+node+" has not mounted", "FailedMount")
	mustSay(t, out, "next: look at the kubelet on node "+node)
	mustLine(t, out, "INFO", "Warning FailedMount x4", "format of disk failed")
	if strings.Contains(out, "no problem found") {
		t.Error(`explain says "no problem found"`)
	}
}
