//go:build upgrade

package interop

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/stack"
)

// An orphaned publication recorded by one build in the ConfigMap
// external-attacher-orphans-<driver> must be undone by the other after
// the swap: the record is csi-attacher's only state besides the API
// objects it acts on (docs/csi-attacher.md, "Orphaned publications").

// orphanRecordNS is where the attachers of the upgrade test record
// orphans: their --leader-election-namespace (swapAttacherArgs).
const orphanRecordNS = "default"

// upgradeOrphan is a publication whose VolumeAttachment was force-deleted
// while it was being published, and whose unpublish fails until fault is
// removed.
type upgradeOrphan struct {
	handle, node, va string
	fault            string
}

// orphanRecords is the orphan ConfigMap's data (nil: no ConfigMap).
func (w *world) orphanRecords() map[string]string {
	w.t.Helper()
	cm, err := w.s.Client.CoreV1().ConfigMaps(orphanRecordNS).Get(w.ctx, attacher.OrphanRecordName(driver), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return cm.Data
}

// recordOrphan makes the running attacher record an orphan: a Pod's
// volume is published slowly, its Pod deleted and its VolumeAttachment
// force-deleted (finalizers removed) once the driver holds the
// publication, with every unpublish of the volume failing Unavailable.
// It returns once the record is in the ConfigMap and an unpublish failed.
func (l *workload) recordOrphan() upgradeOrphan {
	w := l.w
	w.t.Helper()
	l.n++
	o := upgradeOrphan{handle: fmt.Sprintf("%s-orphan-%d", l.ns, l.n), node: worldNodes[0]}
	o.va = vaName(o.handle, o.node)
	if _, err := w.drv.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: o.handle, Phase: csimock.PhaseAfter, Latency: 3 * time.Second, Once: true}); err != nil {
		w.t.Fatal(err)
	}
	var err error
	if o.fault, err = w.drv.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: o.handle, Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
		w.t.Fatal(err)
	}
	w.volume(l.ns, o.handle)
	pod := fmt.Sprintf("orphan-%d", l.n)
	w.pod(l.ns, pod, o.node, o.handle)
	w.eventually(o.handle+" published to "+o.node, func(context.Context) (bool, error) {
		return slices.Contains(w.drv.Published(o.handle), stack.NodeID(o.node)), nil
	})
	w.deletePod(l.ns, pod)
	if err := w.s.Client.StorageV1().VolumeAttachments().Delete(w.ctx, o.va, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		w.t.Fatalf("delete VolumeAttachment %s: %v", o.va, err)
	}
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := w.s.Client.StorageV1().VolumeAttachments().Patch(w.ctx, o.va, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		w.t.Fatalf("remove the finalizers of VolumeAttachment %s: %v", o.va, err)
	}
	w.waitVAGone(o.handle, o.node)
	w.eventually("orphan "+o.va+" recorded and its unpublish failed", func(context.Context) (bool, error) {
		return w.orphanRecords()[o.va] != "" && w.calls("ControllerUnpublishVolume", o.handle, o.node)[codes.Unavailable] > 0, nil
	})
	return o
}

// undone checks that the attacher started after since unpublishes the
// orphan once the fault is removed and drops its record.
func (w *world) orphanUndone(o upgradeOrphan, since time.Time, by string) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("%s retried the unpublish of orphan %s", by, o.va), func(context.Context) (bool, error) {
		return w.unpublishesSince(o, since, codes.Unavailable) > 0, nil
	})
	w.drv.RemoveFault(o.fault)
	w.eventually(fmt.Sprintf("%s unpublished orphan %s and dropped its record", by, o.va), func(context.Context) (bool, error) {
		_, recorded := w.orphanRecords()[o.va]
		return len(w.drv.Published(o.handle)) == 0 && !recorded, nil
	})
	if w.unpublishesSince(o, since, codes.OK) == 0 {
		w.t.Errorf("orphan %s (%s on %s): no successful unpublish by %s", o.va, o.handle, o.node, by)
	}
}

// unpublishesSince counts the finished unpublishes of o with code that
// started after since.
func (w *world) unpublishesSince(o upgradeOrphan, since time.Time, code codes.Code) int {
	n := 0
	for _, c := range w.drv.CallsTo("ControllerUnpublishVolume") {
		if c.VolumeID == o.handle && c.NodeID == stack.NodeID(o.node) && c.Done() && c.Code == code && c.Start.After(since) {
			n++
		}
	}
	return n
}
