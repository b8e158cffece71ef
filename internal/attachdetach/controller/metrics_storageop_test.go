package controller

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kube-controller-manager records storage_operation_duration_seconds
// {operation_name="volume_attach", status="fail-unknown"} when a
// VolumeAttachment it waits for reports an attach error, and "success"
// when a later attempt sees it attached. latch: one failure per attach
// (repeated passes over the error add none), then a success measured from
// the failure.
func TestStorageOperationMetric_attachErrorIsFailUnknownThenSuccess(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))
	name := upstreamVAName("vol-1", testDriver, "node-a")
	vol := uniqueName("vol-1")
	w.waitWrites(1)
	plugin := "kubernetes.io/csi:" + testDriver
	count := func(status string) uint64 {
		return w.histogramCount(StorageOperationDurationMetric, map[string]string{"volume_plugin": plugin, "operation_name": "volume_attach", "status": status, "migrated": "false"})
	}

	setError := func(msg string) {
		t.Helper()
		va, ok := w.va(name)
		if !ok {
			t.Fatalf("VolumeAttachment %s not found", name)
		}
		va.Status.AttachError = &storagev1.VolumeError{Message: msg, Time: metav1.Now()}
		if err := w.tracker.Update(vaResource, va, "", metav1.UpdateOptions{FieldManager: "csi-attacher"}); err != nil {
			t.Fatal(err)
		}
	}
	setError("rpc error: code = Internal desc = backend busy")
	w.eventually("a fail-unknown volume_attach", func() bool { return count("fail-unknown") == 1 })
	// The same error seen again (another pass, a resync) is no new failure.
	va, _ := w.va(name)
	va.Labels = map[string]string{"touched": "yes"}
	if err := w.tracker.Update(vaResource, va, "", metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := count("fail-unknown"); n != 1 {
		t.Errorf("fail-unknown count after the same error again = %d, want 1", n)
	}
	// csi-attacher succeeds on a retry: attached, the error cleared.
	va, _ = w.va(name)
	va.Status.Attached, va.Status.AttachError = true, nil
	if err := w.tracker.Update(vaResource, va, "", metav1.UpdateOptions{FieldManager: "csi-attacher"}); err != nil {
		t.Fatal(err)
	}
	w.eventually("a successful volume_attach", func() bool { return count("success") == 1 })
	w.eventually("the volume in the node status", func() bool {
		p := w.nodePatches("node-a")
		return len(p) == 1 && len(p[0]) == 1 && p[0][0] == vol
	})
	if n := count("fail-unknown"); n != 1 {
		t.Errorf("fail-unknown count = %d, want 1", n)
	}
}
