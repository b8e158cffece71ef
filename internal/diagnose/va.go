package diagnose

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// explainVAState reports the VolumeAttachment of one attachment: missing,
// attaching, failing, attached, or detaching. conflict says a multi-attach
// finding already explains a missing VA.
func (w *walker) explainVAState(a *attachment, conflict bool) {
	va := a.va
	obj := "VolumeAttachment " + a.vaName
	if va == nil {
		if !a.wanted() {
			return
		}
		if !conflict && w.explainCreateFailed(a) {
			return
		}
		f := Finding{Check: "va.exists", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("no VolumeAttachment for the volume on node %s yet (expected name %s)", a.node, a.vaName)}
		switch {
		case conflict:
			f.Hint = "the attach/detach controller does not create it while the multi-attach conflict above lasts"
		case a.nodeObj != nil && a.nodeObj.Annotations[kubenames.ControllerManagedAttachAnnotation] == "":
			f.Hint = "the node is not managed by the attach/detach controller (see above); its kubelet must create the VolumeAttachment"
		default:
			f.Hint = "the attach/detach controller creates it once the Pod is scheduled and the PVC is bound: check that attachdetach-controller (or kube-controller-manager) runs and read its logs for this Pod"
		}
		w.add(f)
		return
	}
	if va.Spec.Attacher != a.vol.driver {
		w.add(Finding{Check: "va.attacher", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("spec.attacher is %q but the volume belongs to driver %q: no csi-attacher will handle it", va.Spec.Attacher, a.vol.driver),
			Hint:    "delete the VolumeAttachment; the attach/detach controller re-creates it with the right attacher"})
		return
	}
	finalizer := kubenames.AttacherFinalizer(a.vol.driver)
	if va.DeletionTimestamp != nil {
		w.explainDetach(a, finalizer)
		return
	}
	created := age(w.s.Now, va.CreationTimestamp.Time)
	switch {
	case va.Status.Attached:
		f := Finding{Check: "va.attached", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("VolumeAttachment is attached to node %s (created %s ago)", a.node, created)}
		if a.wantKnown && !a.wanted() {
			f.Status = StatusWaiting
			f.Message += ", but no running Pod on that node uses the volume"
			f.Hint = "the attach/detach controller detaches it once the kubelet no longer reports the volume in use (see node.volumesInUse); check that the controller runs if this lasts"
		}
		w.add(f)
	case va.Status.AttachError != nil:
		e := va.Status.AttachError
		w.add(Finding{Check: "va.attachError", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("attach to node %s failed %s ago%s: %s", a.node, age(w.s.Now, e.Time.Time), codeSuffix(volumeErrorCode(e)), e.Message),
			Hint:    errorHint(e, a, false)})
	default:
		w.add(Finding{Check: "va.attached", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("VolumeAttachment is not attached yet (created %s ago) and reports no error", created),
			Hint:    fmt.Sprintf("csi-attacher of driver %s has not acted on it yet: check that it runs (see the Lease line) and read its logs", a.vol.driver)})
	}
}

func (w *walker) explainDetach(a *attachment, finalizer string) {
	va := a.va
	obj := "VolumeAttachment " + va.Name
	since := age(w.s.Now, va.DeletionTimestamp.Time)
	if !slices.Contains(va.Finalizers, finalizer) {
		w.add(Finding{Check: "va.detaching", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("VolumeAttachment is being deleted (for %s); csi-attacher is done with it, remaining finalizers: %s", since, orNone(va.Finalizers))})
		return
	}
	if e := va.Status.DetachError; e != nil {
		w.add(Finding{Check: "va.detachError", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("detach from node %s failed %s ago%s (deletion requested %s ago): %s", a.node, age(w.s.Now, e.Time.Time), codeSuffix(volumeErrorCode(e)), since, e.Message),
			Hint:    errorHint(e, a, true)})
	} else {
		w.add(Finding{Check: "va.detaching", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("VolumeAttachment is being deleted (for %s): csi-attacher of driver %s must detach the volume and then remove finalizer %s", since, a.vol.driver, finalizer),
			Hint:    "if this lasts, check that csi-attacher runs (see the Lease line) and read its logs"})
	}
	if a.wanted() {
		w.add(Finding{Check: "va.recreate", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("Pod(s) %s on node %s still want the volume: the attach/detach controller creates a new VolumeAttachment once this one is gone", strings.Join(a.wantedBy, ", "), a.node)})
	}
}

// errorHint turns an attach/detach error into a next step. csi-attacher's
// own messages (see internal/attacher) are matched first, then the gRPC
// code the driver returned.
func errorHint(e *storagev1.VolumeError, a *attachment, detach bool) string {
	msg := e.Message
	if hint, ok := secretHint(msg, a.vol); ok {
		return hint
	}
	if hint, ok := orphanHint(msg, a.vol.driver); ok {
		return hint
	}
	switch {
	case strings.Contains(msg, "CSINode"):
		return fmt.Sprintf("the driver's node plugin must register on node %s first (check its node DaemonSet Pod there); csi-attacher retries as soon as the CSINode changes", a.node)
	case strings.Contains(msg, "is being deleted") && strings.Contains(msg, "PersistentVolume"):
		return "a PersistentVolume that is being deleted is never attached; the Pod needs a new PVC"
	case strings.Contains(msg, "PersistentVolume") && strings.Contains(msg, "not found"):
		return "the VolumeAttachment names a PersistentVolume that does not exist; check the PVC's spec.volumeName"
	case strings.Contains(msg, "not a CSI volume"), strings.Contains(msg, "belongs to CSI driver"), strings.Contains(msg, "spec.source"):
		return "the VolumeAttachment or its PV is malformed; fix the PV (or delete the VolumeAttachment so the controller re-creates it)"
	}
	op := "ControllerPublishVolume"
	if detach {
		op = "ControllerUnpublishVolume"
	}
	if code := volumeErrorCode(e); code != nil {
		switch *code {
		case 4, 14, 10, 1: // DeadlineExceeded, Unavailable, Aborted, Canceled
			return fmt.Sprintf("%s timed out or the driver was unavailable: the operation may still be in progress and is retried with backoff; read the logs of driver %s's controller Pod", op, a.vol.driver)
		case 5: // NotFound
			return fmt.Sprintf("the driver says the volume (handle %s) or the node does not exist in the storage backend; check both there", a.vol.handle)
		case 9: // FailedPrecondition
			return "the driver refuses in the volume's current state; often the volume is still attached to another node in the backend — check there"
		case 8: // ResourceExhausted
			return fmt.Sprintf("node %s reached its limit of attached volumes (CSINode allocatable count) or a backend quota; move Pods elsewhere or raise the limit", a.node)
		case 3: // InvalidArgument
			return "the driver rejected the request (access mode, fsType, volume context or secret); check the PV's spec.csi and the StorageClass parameters"
		case 7, 16: // PermissionDenied, Unauthenticated
			if ref := a.vol.publishSecret; ref != nil {
				return fmt.Sprintf("the driver was refused by the storage backend; check the credentials in Secret %s/%s (spec.csi.controllerPublishSecretRef of %s): kubectl -n %s get secret %s -o yaml, and the driver's own credentials",
					ref.Namespace, ref.Name, a.vol.object, ref.Namespace, ref.Name)
			}
			return "the driver was refused by the storage backend; check the controller-publish secret of the PV and the driver's credentials"
		}
	}
	return fmt.Sprintf("read the logs of csi-attacher and of driver %s's controller Pod; the error is retried with backoff", a.vol.driver)
}

func codeSuffix(code *int32) string {
	if code == nil {
		return ""
	}
	return fmt.Sprintf(" (gRPC code %d)", *code)
}

// explainLease checks that a csi-attacher of the driver runs, through its
// leader election Lease; once per driver. important says something waits
// for the attacher, which makes a missing Lease worth more than a note.
//
// needed says the attacher would have work now (not only once the kubelet
// unmounted a volume): a missing attacher is then a problem, else waiting.
func (w *walker) explainLease(driver string, important, needed bool) {
	if w.leaseChecked[driver] {
		return
	}
	w.leaseChecked[driver] = true
	name := kube.LeaseName(driver)
	obj := "Lease " + name
	leases, ref := w.leases(name)
	if why, ok := w.unreadable(ref); ok {
		w.add(Finding{Check: "attacher.lease", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("could not read Leases (%s): cannot tell whether csi-attacher of driver %s runs", why, driver),
			Hint:    "grant list on leases.coordination.k8s.io, or check the csi-attacher Pods by hand"})
		return
	}
	if len(leases) == 0 {
		w.explainNoLease(name, driver, important, needed)
		return
	}
	// Several namespaces may hold one (an old install); the freshest tells
	// whether some attacher is alive.
	l := slices.MaxFunc(leases, func(x, y *coordLease) int { return renewed(x).Compare(renewed(y)) })
	where := key(l.Namespace, l.Name)
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	duration := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	last := renewed(l)
	switch {
	case holder == "":
		w.add(Finding{Check: "attacher.lease", Object: "Lease " + where, Status: StatusProblem,
			Message: fmt.Sprintf("Lease %s has no holder: csi-attacher of driver %s released it and no instance runs", where, driver),
			Hint:    fmt.Sprintf("start csi-attacher for %s: kubectl -n %s get pods | grep -i attacher", driver, l.Namespace)})
	case last.IsZero() || w.s.Now.Sub(last) > 2*duration:
		w.add(Finding{Check: "attacher.lease", Object: "Lease " + where, Status: StatusProblem,
			Message: fmt.Sprintf("Lease %s is stale: held by %s, last renewed %s ago (lease duration %s): csi-attacher of driver %s is not running or cannot reach the API server", where, holder, ageOrNever(w.s.Now, last), duration, driver),
			Hint:    fmt.Sprintf("check the csi-attacher Pods of %s: kubectl -n %s get pods -o wide, then kubectl -n %s logs <pod> -c csi-attacher", driver, l.Namespace, l.Namespace)})
	default:
		w.add(Finding{Check: "attacher.lease", Object: "Lease " + where, Status: StatusOK,
			Message: fmt.Sprintf("csi-attacher of driver %s runs: Lease %s held by %s, renewed %s ago", driver, where, holder, age(w.s.Now, last))})
		w.explainOrphanRecord(l, driver)
	}
}

// explainNodeVolumes checks the node's side: volumesAttached (written by
// the attach/detach controller, read by the kubelet before mounting) and
// volumesInUse (written by the kubelet, blocks detach).
func (w *walker) explainNodeVolumes(a *attachment) {
	n := a.nodeObj
	if n == nil {
		return
	}
	obj := "Node " + a.node
	u := kubenames.UniqueVolumeName(a.vol.driver, a.vol.handle)
	attached := slices.ContainsFunc(n.Status.VolumesAttached, func(av v1.AttachedVolume) bool { return av.Name == u })
	inUse := slices.Contains(n.Status.VolumesInUse, u)
	va := a.va
	detaching := va != nil && va.DeletionTimestamp != nil
	unwanted := a.wantKnown && !a.wanted()
	switch {
	case va != nil && va.Status.Attached && !detaching && !attached && a.wanted():
		w.add(Finding{Check: "node.volumesAttached", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("the volume is attached but node %s's status.volumesAttached does not list %s yet; the kubelet waits for it before mounting", a.node, u),
			Hint:    "the attach/detach controller writes it; check that attachdetach-controller (or kube-controller-manager) runs"})
	case attached && (va == nil || !va.Status.Attached) && !detaching:
		w.add(Finding{Check: "node.volumesAttached", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("node %s's status.volumesAttached lists %s although no attached VolumeAttachment backs it", a.node, u)})
	case attached:
		w.add(Finding{Check: "node.volumesAttached", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("node %s lists %s in status.volumesAttached", a.node, u)})
	}
	switch {
	case inUse && (detaching || unwanted):
		w.add(Finding{Check: "node.volumesInUse", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("the kubelet on node %s still reports %s in status.volumesInUse: the volume is detached only after the kubelet has unmounted it", a.node, u),
			Hint: fmt.Sprintf("check which Pods on the node still use it (kubectl get pods -A --field-selector spec.nodeName=%s) and the kubelet's unmount errors; if the node is dead, taint it with %s=nodeshutdown:NoExecute (or wait for the 6-minute force detach after NotReady)",
				a.node, kubenames.OutOfServiceTaintKey)})
	case inUse:
		w.add(Finding{Check: "node.volumesInUse", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("the kubelet on node %s reports the volume in use (mounted or mounting)", a.node)})
	case detaching:
		w.add(Finding{Check: "node.volumesInUse", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("the kubelet on node %s no longer reports the volume in use: nothing on the node blocks the detach", a.node)})
	}
}

// podEventReasons are the kubelet's and the attach/detach controller's
// volume warnings on Pods.
func podEventReasons() []string {
	return append([]string{"FailedAttachVolume"}, kubeletVolumeWarnings()...)
}

const maxEvents = 3

// explainEvents shows the latest Warning events of an object, restricted
// to reasons when not nil.
func (w *walker) explainEvents(kind RefKind, namespace, name, obj string, reasons []string) {
	k := eventKey(kind, namespace, name)
	if w.eventsShown[k] {
		return
	}
	w.eventsShown[k] = true
	evs, ref := w.events(kind, namespace, name)
	if why, ok := w.unreadable(ref); ok {
		w.add(Finding{Check: "events", Object: obj, Status: StatusInfo, Message: fmt.Sprintf("could not read events: %s", why)})
		return
	}
	var warnings []*v1.Event
	for _, e := range evs {
		if e.Type == v1.EventTypeWarning && (reasons == nil || slices.Contains(reasons, e.Reason)) {
			warnings = append(warnings, e)
		}
	}
	slices.SortFunc(warnings, func(x, y *v1.Event) int { return eventTime(y).Compare(eventTime(x)) })
	for _, e := range warnings[:min(len(warnings), maxEvents)] {
		count := ""
		if e.Count > 1 {
			count = fmt.Sprintf(" x%d", e.Count)
		}
		w.add(Finding{Check: "events", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("Warning %s%s, %s ago: %s", e.Reason, count, ageOrNever(w.s.Now, eventTime(e)), strings.TrimSpace(e.Message))})
	}
}

func eventTime(e *v1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// vaState is a few words about a VolumeAttachment for lists.
func vaState(va *storagev1.VolumeAttachment) string {
	switch {
	case va.DeletionTimestamp != nil:
		return "detaching"
	case va.Status.Attached:
		return "attached"
	case va.Status.AttachError != nil:
		return "failing"
	}
	return "pending"
}
