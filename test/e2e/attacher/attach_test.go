package attacher_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

func TestAttachThenDetachPVPublishesOnceAndCleansUp(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName, va := e.attachOne(30 * time.Second)
	if got := e.driver.PublishCount(pv, e.nodeID); got != 1 {
		t.Errorf("ControllerPublish calls for %s on %s = %d, want 1", pv, e.nodeID, got)
	}
	if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) {
		t.Errorf("VA finalizers = %v, want %s", va.Finalizers, kubenames.AttacherFinalizer(e.name))
	}
	if va.Annotations[kubenames.VANodeIDAnnotation] != e.nodeID || va.Annotations[attacher.AnnVolumeHandle] != pv {
		t.Errorf("VA annotations = %v", va.Annotations)
	}
	var pub *csimock.PublicationState
	for _, vol := range e.driver.State().Volumes {
		if vol.ID == pv && len(vol.Published) == 1 {
			pub = &vol.Published[0]
		}
	}
	if pub == nil || !maps.Equal(va.Status.AttachmentMetadata, pub.PublishContext) {
		t.Fatalf("attachmentMetadata = %v, want the driver's publish context (publication %+v)", va.Status.AttachmentMetadata, pub)
	}
	// The driver supports SINGLE_NODE_MULTI_WRITER, so RWO maps to it.
	if !strings.Contains(pub.AccessMode, "SINGLE_NODE_MULTI_WRITER") || !strings.Contains(strings.ToLower(pub.AccessType), "mount") {
		t.Errorf("published with access mode %q type %q, want SINGLE_NODE_MULTI_WRITER mount", pub.AccessMode, pub.AccessType)
	}
	pvObj, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pvObj.Finalizers, kubenames.PVFinalizer(e.name)) {
		t.Errorf("PV finalizers = %v, want %s", pvObj.Finalizers, kubenames.PVFinalizer(e.name))
	}
	// Writes: one metadata patch + one status patch on the VA, one PV patch.
	if got := e.writes.Count("PATCH volumeattachments"); got != 1 {
		t.Errorf("VA metadata patches = %d, want 1", got)
	}
	if got := e.writes.Count("PATCH volumeattachments/status"); got != 1 {
		t.Errorf("VA status patches = %d, want 1", got)
	}
	if got := e.writes.Count("PATCH persistentvolumes"); got != 1 {
		t.Errorf("PV patches = %d, want 1", got)
	}

	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Errorf("volume still published to %v after detach", got)
	}
	if got := len(e.driver.CallsTo("ControllerUnpublishVolume")); got != 1 {
		t.Errorf("ControllerUnpublish calls = %d, want 1", got)
	}
	// Detach is one write: the finalizer removal; no status write to a
	// VA that is gone.
	if got := e.writes.Count("PATCH volumeattachments/status"); got != 1 {
		t.Errorf("VA status patches after detach = %d, want still 1", got)
	}
	if got := e.writes.Count("PATCH volumeattachments"); got != 2 {
		t.Errorf("VA metadata patches after detach = %d, want 2", got)
	}

	// PV finalizer goes once the PV is deleted and no VA refers to it.
	if err := e.client.CoreV1().PersistentVolumes().Delete(e.ctx, pv, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// (kubernetes.io/pv-protection stays: no PV controller runs here.)
	e.eventually(30*time.Second, "attacher's PV finalizer removed", func() (bool, error) {
		p, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
		return err == nil && !slices.Contains(p.Finalizers, kubenames.PVFinalizer(e.name)), nil
	})
}

func TestAttachInlineVolumeSpec(t *testing.T) {
	e := newEnv(t, envOptions{})
	vaName := e.prefix + "-va"
	va := e.newVA(vaName, "", e.node)
	va.Spec.Source = storagev1.VolumeAttachmentSource{InlineVolumeSpec: &v1.PersistentVolumeSpec{
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadOnlyMany},
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
			Driver: e.name, VolumeHandle: "inline-handle", ReadOnly: true,
		}},
	}}
	e.createVA(va)
	e.waitAttached(vaName, 30*time.Second)
	calls := e.driver.CallsTo("ControllerPublishVolume")
	if len(calls) != 1 || calls[0].VolumeID != "inline-handle" || !calls[0].Readonly {
		t.Fatalf("publish calls = %+v, want one readonly publish of inline-handle", calls)
	}
	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := e.driver.Published("inline-handle"); len(got) != 0 {
		t.Errorf("inline volume still published to %v", got)
	}
}

func TestAttachWaitsForPVAndRetriesAsSoonAsItAppears(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, fmt.Sprintf("PersistentVolume %q not found", pv))
	// Let the backoff grow past what the test waits below.
	time.Sleep(2 * time.Second)
	start := time.Now()
	e.createPV(pv)
	e.waitAttached(vaName, 5*time.Second)
	t.Logf("attached %s after the PV appeared", time.Since(start))
	va := e.getVA(vaName)
	if va.Status.AttachError != nil {
		t.Errorf("attachError not cleared after attach: %+v", va.Status.AttachError)
	}
}

func TestAttachWaitsForCSINodeAndRetriesAsSoonAsDriverRegisters(t *testing.T) {
	e := newEnv(t, envOptions{noCSINode: true})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, fmt.Sprintf("CSINode %q not found", e.node))
	if n := len(e.driver.CallsTo("ControllerPublishVolume")); n != 0 {
		t.Fatalf("driver called %d times without a node ID", n)
	}
	time.Sleep(2 * time.Second)
	e.createCSINode(e.node, e.nodeID)
	e.waitAttached(vaName, 5*time.Second)
	if got := e.driver.PublishCount(pv, e.nodeID); got != 1 {
		t.Errorf("publishes = %d, want 1", got)
	}
}

func TestAttachDriverErrorIsReportedWithCodeAndRetried(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Times: 5, Code: codes.Internal, Message: "backend on fire"}); err != nil {
		t.Fatal(err)
	}
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	va := e.waitAttachError(vaName, "backend on fire")
	if va.Status.AttachError.ErrorCode != nil && *va.Status.AttachError.ErrorCode != int32(codes.Internal) {
		t.Errorf("errorCode = %d, want %d (Internal)", *va.Status.AttachError.ErrorCode, codes.Internal)
	}
	e.waitAttached(vaName, 30*time.Second)
	if got := len(e.driver.CallsTo("ControllerPublishVolume")); got != 6 {
		t.Errorf("publish calls = %d, want 5 failures + 1 success", got)
	}
	// One event for the failure, not one per retry.
	events, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + vaName})
	if err != nil {
		t.Fatal(err)
	}
	var failed int32
	for _, ev := range events.Items {
		if ev.Reason == attacher.EventAttachFailed {
			failed += max(ev.Count, 1)
		}
	}
	if failed != 1 {
		t.Errorf("AttachFailed events = %d, want 1 (deduplicated by message)", failed)
	}
}

func TestDriverHangingPastTimeoutKeepsFinalizerAndRetries(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Once: true, Hang: true}); err != nil {
		t.Fatal(err)
	}
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	// The error is transient (the retry after the timeout succeeds), so
	// check what stays: the call log and the event.
	va := e.waitAttached(vaName, 30*time.Second)
	if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) {
		t.Errorf("finalizer missing after attach")
	}
	calls := e.driver.CallsTo("ControllerPublishVolume")
	if len(calls) != 2 || calls[0].Code == codes.OK || calls[1].Code != codes.OK {
		t.Fatalf("publish calls = %+v, want a timed-out call then a successful retry", calls)
	}
	if msg := e.eventMessage(vaName, attacher.EventAttachFailed); !strings.Contains(msg, "DeadlineExceeded") {
		t.Errorf("AttachFailed event message = %q, want DeadlineExceeded", msg)
	}
}

func TestDetachAfterPVDeletedUsesRecordedHandle(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName, _ := e.attachOne(30 * time.Second)

	// Delete the PV and strip its finalizer by hand, the way an impatient
	// operator does: the PV is really gone before the VA.
	if err := e.client.CoreV1().PersistentVolumes().Delete(e.ctx, pv, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pvObj, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvObj.Finalizers = nil
	if _, err := e.client.CoreV1().PersistentVolumes().Update(e.ctx, pvObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "PV gone", func() (bool, error) {
		_, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Errorf("volume still published to %v", got)
	}
}

func TestMissingSecretIsReportedThenAttachesWhenCreated(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName, secret := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-secret"
	e.createPV(pv, func(s *localcluster.VolumeSpec) {
		s.SecretRef = &v1.SecretReference{Namespace: "default", Name: secret}
	})
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, fmt.Sprintf("secret default/%s not found", secret))
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: secret}, StringData: map[string]string{"password": "hunter2-e2e"}}
	if _, err := e.client.CoreV1().Secrets("default").Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAttached(vaName, 10*time.Second)
	va := e.getVA(vaName)
	if va.Annotations[attacher.AnnSecretRef] != "default/"+secret {
		t.Errorf("secret reference annotation = %q", va.Annotations[attacher.AnnSecretRef])
	}
}

func TestListVolumesReconcileRepublishesAfterOutOfBandUnpublish(t *testing.T) {
	e := newEnv(t, envOptions{reconcileSync: 300 * time.Millisecond})
	pv, vaName, _ := e.attachOne(30 * time.Second)

	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := csipb.NewControllerClient(conn).ControllerUnpublishVolume(e.ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: pv, NodeId: e.nodeID}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "volume published again", func() (bool, error) {
		return e.driver.PublishCount(pv, e.nodeID) == 2 && slices.Contains(e.driver.Published(pv), e.nodeID), nil
	})
	e.waitAttached(vaName, 10*time.Second)
}

func TestTrivialDriverWithoutPublishMarksAttachedWithoutFinalizers(t *testing.T) {
	caps := csimock.AllCapabilities()
	caps.PublishUnpublishVolume = false
	e := newEnv(t, envOptions{caps: &caps})
	_, vaName, va := e.attachOne(30 * time.Second)
	if len(va.Finalizers) != 0 {
		t.Errorf("trivial attach added finalizers %v", va.Finalizers)
	}
	if n := len(e.driver.CallsTo("ControllerPublishVolume")); n != 0 {
		t.Errorf("trivial attach called ControllerPublish %d times", n)
	}
	e.deleteVA(vaName)
	e.waitGone(vaName)
}

func TestLeaderElectionStandbyTakesOverWhenLeaderStops(t *testing.T) {
	e := newEnv(t, envOptions{leader: true})
	pv1, va1 := e.prefix+"-pv1", e.prefix+"-va1"
	e.createPV(pv1)
	e.createVA(e.newVA(va1, pv1, e.node))
	e.waitAttached(va1, 30*time.Second)
	standbyStop := e.startAttacher(envOptions{leader: true}, "standby")
	t.Cleanup(standbyStop)

	lease, err := e.client.CoordinationV1().Leases("default").Get(e.ctx, kube.LeaseName(e.name), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("lease %s: %v", kube.LeaseName(e.name), err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "standby" {
		t.Fatalf("lease holder = %v, want the first replica", ptrString(lease.Spec.HolderIdentity))
	}
	// Stop the leader: it releases the lease and the standby takes over
	// well before the lease would have expired.
	e.stopAtt()
	pv2, va2 := e.prefix+"-pv2", e.prefix+"-va2"
	e.createPV(pv2)
	e.createVA(e.newVA(va2, pv2, e.node))
	e.waitAttached(va2, 30*time.Second)
	lease, err = e.client.CoordinationV1().Leases("default").Get(e.ctx, kube.LeaseName(e.name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "standby" {
		t.Fatalf("lease holder = %v, want standby", ptrString(lease.Spec.HolderIdentity))
	}
	if got := e.driver.PublishCount(pv1, e.nodeID); got != 1 {
		t.Errorf("first volume published %d times across the handover, want 1", got)
	}
}

func TestBurstOfVolumeAttachmentsPublishesEachExactlyOnce(t *testing.T) {
	const n = 1000
	// 2,000 creates and 3,000 attacher writes in two minutes: on a loaded
	// machine the API server, whose etcd queues every write behind the
	// burst's, answers a Lease write in 1 to 4 s. With the binary's Lease
	// timings a renewal (one update) has 5 s: the renewal is sent 5 s after
	// the last one was, and the renew deadline is 10 s after that one.
	e := newEnv(t, envOptions{flagLease: true})
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	// Create PVs first (not counted: they are the test's writes), then
	// all VAs at once.
	sem := make(chan struct{}, 32)
	errs := make(chan error, 2*n)
	run := func(f func() error) {
		sem <- struct{}{}
		go func() { defer func() { <-sem }(); errs <- f() }()
	}
	for i := range n {
		name := fmt.Sprintf("%s-pv-%04d", e.prefix, i)
		run(func() error {
			_, err := e.client.CoreV1().PersistentVolumes().Create(ctx, &v1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1.PersistentVolumeSpec{
					AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
					Capacity:    v1.ResourceList{v1.ResourceStorage: *resourceGi()},
					PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
						Driver: e.name, VolumeHandle: name,
					}},
				},
			}, metav1.CreateOptions{})
			return err
		})
	}
	for i := range n {
		name := fmt.Sprintf("%s-pv-%04d", e.prefix, i)
		run(func() error {
			_, err := e.client.StorageV1().VolumeAttachments().Create(ctx, e.newVA(name, name, e.node), metav1.CreateOptions{})
			return err
		})
	}
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	e.eventually(2*time.Minute, "all attached", func() (bool, error) {
		list, err := e.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		attached := 0
		for _, va := range list.Items {
			if va.Spec.Attacher == e.name && va.Status.Attached {
				attached++
			}
		}
		return attached == n, nil
	})
	t.Logf("%d VolumeAttachments attached %s after the last was created", n, time.Since(start))
	stats := e.driver.Stats()
	if got := len(e.driver.CallsTo("ControllerPublishVolume")); got != n {
		t.Errorf("ControllerPublish calls = %d, want exactly %d", got, n)
	}
	if stats.Publish.DuplicatePublishes != 0 {
		t.Errorf("duplicate publishes = %d, want 0", stats.Publish.DuplicatePublishes)
	}
	w := e.writes.Counts()
	if w["PATCH volumeattachments"] > n || w["PATCH volumeattachments/status"] > n || w["PATCH persistentvolumes"] > n {
		t.Errorf("writes = %v, want at most %d of each (one metadata, one status per VA, one per PV)", w, n)
	}
}

func resourceGi() *resource.Quantity { q := resource.MustParse("1Gi"); return &q }

func ptrString(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// Other drivers' objects are cached as placeholders (attacher.ForeignPV,
// attacher.ForeignVA): the attacher must leave other attachers'
// VolumeAttachments alone, still tell a VolumeAttachment of ours which
// driver its PV belongs to, and still remove its finalizer from another
// driver's PV that carries it.
func TestOtherDriversObjectsAreLeftAloneExceptOurFinalizer(t *testing.T) {
	e := newEnv(t, envOptions{})
	const other = "other.csi.test"
	otherPV, otherVA := e.prefix+"-other-pv", e.prefix+"-other-va"
	e.createPV(otherPV, func(s *localcluster.VolumeSpec) { s.Driver = other })
	va := e.newVA(otherVA, otherPV, e.node)
	va.Spec.Attacher = other
	e.createVA(va)

	// A VA of ours naming the other driver's PV is told whose it is.
	mixedVA := e.prefix + "-mixed-va"
	e.createVA(e.newVA(mixedVA, otherPV, e.node))
	e.waitAttachError(mixedVA, fmt.Sprintf("PersistentVolume %q belongs to CSI driver %q", otherPV, other))

	// A VA of ours on our PV attaches, the other attacher's is untouched.
	ourPV, ourVA := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(ourPV)
	e.createVA(e.newVA(ourVA, ourPV, e.node))
	e.waitAttached(ourVA, 30*time.Second)
	got := e.getVA(otherVA)
	if len(got.Finalizers) != 0 || got.Status.Attached || got.Status.AttachError != nil || len(got.Annotations) != 0 {
		t.Errorf("other attacher's VolumeAttachment was written: finalizers %v, status %+v, annotations %v", got.Finalizers, got.Status, got.Annotations)
	}
	if calls := e.driver.CallsTo("ControllerPublishVolume"); len(calls) != 1 || calls[0].VolumeID != ourPV {
		t.Errorf("publish calls = %+v, want one, of %s", calls, ourPV)
	}
	p, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, otherPV, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(p.Finalizers, kubenames.PVFinalizer(e.name)) {
		t.Fatalf("other driver's PV got our finalizer: %v", p.Finalizers)
	}

	// Our finalizer on another driver's PV (left by an earlier driver
	// name, say) is removed once the PV is deleted and no VA of ours
	// names it.
	e.deleteVA(mixedVA)
	e.waitGone(mixedVA)
	p.Finalizers = append(p.Finalizers, kubenames.PVFinalizer(e.name))
	if _, err := e.client.CoreV1().PersistentVolumes().Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().PersistentVolumes().Delete(e.ctx, otherPV, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "our finalizer removed from the other driver's PV", func() (bool, error) {
		p, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, otherPV, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && !slices.Contains(p.Finalizers, kubenames.PVFinalizer(e.name)), err
	})
	if got := e.getVA(otherVA); len(got.Finalizers) != 0 || got.Status.Attached {
		t.Errorf("other attacher's VolumeAttachment was written: %+v", got)
	}
}
