package interop

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// TestLatchADAttachesWhenPVArrivesAfterPod: a Pod on a node whose bound
// PVC names a PV that does not exist yet, the PV created 2 seconds
// later. latch's attach/detach controller creates the VolumeAttachment at
// the PV's event. kube-controller-manager's has no PV event handler and
// made none in 100 seconds (it waits for its next full Pod list, up to 3
// minutes: too long for the suite, see docs/interop.md), which is why the
// worlds wait kcmPVGrace between a volume and its Pod on kcm pairs.
func TestLatchADAttachesWhenPVArrivesAfterPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, pair{latchAD, latchAt})
	ns := w.namespace("late-pv")
	const name = "late-pv-1"
	c := w.s.Client
	size := resource.MustParse("1Gi")
	pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:   v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: size}},
			VolumeName:  name, StorageClassName: new(string),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: pvc.Spec.AccessModes, Capacity: v1.ResourceList{v1.ResourceStorage: size}}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.pod(ns, "app", "node-a", name)
	w.consistently("no VolumeAttachment while the PV does not exist", 2*time.Second, func(context.Context) (bool, error) {
		_, ok := w.getVA(vaName(name, "node-a"))
		return !ok, nil
	})
	pv, err := c.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes:                   pvc.Spec.AccessModes,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: size},
			ClaimRef:                      &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: name, UID: pvc.UID},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: name}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The PV may be written before its status is (csi-attacher adds its
	// finalizer once the controller made the VolumeAttachment, which can
	// be at once): retry on the conflict from the latest copy.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if pv.Status.Phase == v1.VolumeBound {
			return nil
		}
		pv.Status.Phase = v1.VolumeBound
		_, err := c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				pv = latest
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	within := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		for !cond() {
			if time.Since(start) > d {
				w.logVolume(name, "node-a")
				t.Fatalf("%s: not within %s of the PV's creation", what, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	within("VolumeAttachment of "+name+" on node-a", 5*time.Second, func() bool {
		_, ok := w.getVA(vaName(name, "node-a"))
		return ok
	})
	t.Logf("VolumeAttachment made %s after the PV", time.Since(start).Round(time.Millisecond))
	w.waitAttached(name, "node-a")
	w.waitNodeAttached("node-a", unique(name))
	w.waitPodRunning(ns, "app")
	w.deletePod(ns, "app")
	w.waitVAGone(name, "node-a")
	w.waitNodeAttached("node-a")
}
