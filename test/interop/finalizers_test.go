package interop

import (
	"context"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// attacherFinalizer is the finalizer both attachers put on a PV that a
// VolumeAttachment refers to: external-attacher/<driver name with every
// character outside [a-zA-Z0-9-] replaced by "-">. Both remove it once
// the PV is deleting and no VolumeAttachment refers to it.
const attacherFinalizer = "external-attacher/pd-csi-storage-gke-io"

// pvAttacherFinalizer says whether PV name carries attacherFinalizer
// (a PV that is gone carries nothing).
func (w *world) pvAttacherFinalizer(ctx context.Context, name string) (bool, error) {
	pv, err := w.s.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.Contains(pv.Finalizers, attacherFinalizer), nil
}

// vaRefs maps each PV name to the VolumeAttachments that refer to it.
func (w *world) vaRefs() map[string][]string {
	w.t.Helper()
	vas, err := w.s.Client.StorageV1().VolumeAttachments().List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, va := range vas.Items {
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
			out[*pv] = append(out[*pv], va.Name)
		}
	}
	return out
}

// checkPVFinalizers checks the attacher's PV finalizer after the swaps:
// every PV a VolumeAttachment refers to carries it; then every PV of the
// workload is deleted, and the finalizer goes from each PV no
// VolumeAttachment refers to (none leaked) and stays on each one a live
// VolumeAttachment still refers to (none lost), for 3 seconds.
func (l *workload) checkPVFinalizers() {
	w := l.w
	w.t.Helper()
	refs := w.vaRefs()
	for _, pv := range l.vols {
		has, err := w.pvAttacherFinalizer(w.ctx, pv)
		if err != nil {
			w.t.Fatal(err)
		}
		if len(refs[pv]) > 0 && !has {
			w.t.Errorf("PV %s lacks %s while VolumeAttachments %v refer to it", pv, attacherFinalizer, refs[pv])
		}
	}
	for _, pv := range l.vols {
		if err := w.s.Client.CoreV1().PersistentVolumes().Delete(w.ctx, pv, metav1.DeleteOptions{}); err != nil {
			w.t.Fatal(err)
		}
	}
	for _, pv := range l.vols {
		if len(refs[pv]) == 0 {
			w.eventually(attacherFinalizer+" off the deleted PV "+pv+", which no VolumeAttachment refers to", func(ctx context.Context) (bool, error) {
				has, err := w.pvAttacherFinalizer(ctx, pv)
				return !has, err
			})
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		now := w.vaRefs()
		for _, pv := range l.vols {
			if len(refs[pv]) == 0 || len(now[pv]) == 0 {
				continue
			}
			if has, err := w.pvAttacherFinalizer(w.ctx, pv); err != nil || !has {
				w.t.Fatalf("%s went from the deleting PV %s while VolumeAttachments %v refer to it (err %v)", attacherFinalizer, pv, now[pv], err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkPVFinalizersGone: once no VolumeAttachment is left, no PV of the
// workload (all deleting, checkPVFinalizers) keeps the attacher's
// finalizer.
func (l *workload) checkPVFinalizersGone() {
	w := l.w
	w.t.Helper()
	for _, pv := range l.vols {
		w.eventually(attacherFinalizer+" off the deleted PV "+pv+" after its detach", func(ctx context.Context) (bool, error) {
			has, err := w.pvAttacherFinalizer(ctx, pv)
			return !has, err
		})
	}
}
