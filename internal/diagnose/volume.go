package diagnose

import (
	"fmt"
	"slices"
	"strings"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

// annVolumeHandle is the annotation latch's csi-attacher records the volume
// handle in (attacher.AnnVolumeHandle; a test keeps them equal). It is
// copied rather than imported so that latchctl does not link the attacher
// and its gRPC stack.
const annVolumeHandle = "attacher.latch.dev/volume-handle"

// attacherFinalizerPrefix is the prefix of kubenames.AttacherFinalizer.
const attacherFinalizerPrefix = "external-attacher/"

// volume is what the attach pipeline attaches: a CSI volume of one driver.
type volume struct {
	object string // "PersistentVolume x", for findings
	pvName string // "" for inline volumes
	driver string
	handle string
	modes  []v1.PersistentVolumeAccessMode
	// claim is the bound PVC, nil when unknown; Pods using it are the
	// volume's users.
	claim *v1.PersistentVolumeClaim
	// inlinePod is the Pod of an inline volume (its only user).
	inlinePod *v1.Pod
	// attachRequired is false when the CSIDriver says so.
	attachRequired bool
	// publishSecret is spec.csi.controllerPublishSecretRef (nil: none or
	// not known).
	publishSecret *v1.SecretReference
}

// explainPV reports the PV's own state and resolves it to a CSI volume; it
// returns nil when there is nothing more to explain (not CSI, or no attach
// needed).
func (w *walker) explainPV(pv *v1.PersistentVolume, pvc *v1.PersistentVolumeClaim) *volume {
	obj := "PersistentVolume " + pv.Name
	vol := &volume{object: obj, pvName: pv.Name, modes: pv.Spec.AccessModes, claim: pvc}
	csi := pv.Spec.CSI
	if csi == nil {
		tr := csitrans.New()
		if !tr.IsPVMigratable(pv) {
			w.add(Finding{Check: "pv.csi", Object: obj, Status: StatusInfo,
				Message: "PV is not a CSI volume and no CSI driver migrates its in-tree plugin: latch does not attach it"})
			return nil
		}
		plugin, _ := tr.GetInTreePluginNameFromSpec(pv, nil)
		translated, err := tr.TranslateInTreePVToCSI(klog.Background(), pv)
		if err != nil || translated == nil || translated.Spec.CSI == nil {
			w.add(Finding{Check: "pv.csi", Object: obj, Status: StatusProblem,
				Message: fmt.Sprintf("PV uses in-tree plugin %s, but translating it to CSI failed: %v", plugin, err),
				Hint:    "fix the in-tree volume source of the PV; csi-attacher fails the same way"})
			return nil
		}
		csi = translated.Spec.CSI
		w.add(Finding{Check: "pv.csi", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("PV uses in-tree plugin %s, attached through CSI migration by driver %s (translated volume handle %s)", plugin, csi.Driver, csi.VolumeHandle)})
	} else {
		w.add(Finding{Check: "pv.csi", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("PV is a CSI volume of driver %s, volume handle %s", csi.Driver, csi.VolumeHandle)})
	}
	vol.driver, vol.handle, vol.publishSecret = csi.Driver, csi.VolumeHandle, csi.ControllerPublishSecretRef
	if vol.handle == "" {
		w.add(Finding{Check: "pv.csi", Object: obj, Status: StatusProblem,
			Message: "spec.csi.volumeHandle is empty: the volume cannot be attached",
			Hint:    "re-create the PV with the volume handle of the backend volume"})
		return nil
	}
	w.explainPVDeletion(pv, vol)
	if !w.explainDriver(vol.driver) {
		return nil
	}
	vol.attachRequired = true
	return vol
}

// explainPVDeletion explains a PV stuck Terminating. csi-attacher's
// finalizer stays until no VolumeAttachment references the PV, so the
// useful answer is which VAs those are.
func (w *walker) explainPVDeletion(pv *v1.PersistentVolume, vol *volume) {
	if pv.DeletionTimestamp == nil {
		return
	}
	obj := "PersistentVolume " + pv.Name
	since := age(w.s.Now, pv.DeletionTimestamp.Time)
	var ours, others []string
	for _, f := range pv.Finalizers {
		if strings.HasPrefix(f, attacherFinalizerPrefix) {
			ours = append(ours, f)
		} else {
			others = append(others, f)
		}
	}
	if len(ours) == 0 {
		msg := fmt.Sprintf("PV is Terminating (for %s)", since)
		if len(others) > 0 {
			msg += fmt.Sprintf(", held by finalizer(s) %s", strings.Join(others, ", "))
		}
		w.add(Finding{Check: "pv.deleting", Object: obj, Status: StatusInfo,
			Message: msg + "; no csi-attacher finalizer is involved (kubernetes.io/pv-protection waits until no PVC is bound to the PV)"})
		return
	}
	var holders []string
	for _, va := range w.vasOfPV(pv.Name) {
		holders = append(holders, fmt.Sprintf("%s (node %s, %s)", va.Name, va.Spec.NodeName, vaState(va)))
	}
	if len(holders) > 0 {
		w.add(Finding{Check: "pv.deleting", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("PV is Terminating (for %s) and held by finalizer %s: VolumeAttachment(s) still reference it: %s",
				since, strings.Join(ours, ", "), listNames(holders, 5)),
			Hint: "the finalizer goes once those VolumeAttachments are detached and deleted; they are detached when no Pod on their node uses the volume any more — run `latchctl explain va NAME` for each; do not remove the finalizer by hand while the volume may still be attached"})
		return
	}
	w.add(Finding{Check: "pv.deleting", Object: obj, Status: StatusProblem,
		Message: fmt.Sprintf("PV is Terminating (for %s) and still carries finalizer %s although no VolumeAttachment references it",
			since, strings.Join(ours, ", ")),
		Hint: fmt.Sprintf("csi-attacher of driver %s removes it; check that it runs (see the Lease below). It also keeps it while an orphaned publication of the volume (a VolumeAttachment deleted while it was being published) is not yet unpublished: look for an entry naming this PV or its volume handle in the ConfigMap %s in the Lease's namespace, and at csi-attacher's log. If that driver is gone for good and the volume is detached in the backend, remove the finalizer: kubectl patch pv %s --type=merge -p '{\"metadata\":{\"finalizers\":null}}'", vol.driver, kube.OrphanRecordName(vol.driver), pv.Name)})
	// No VA, so no attachment chain will check the attacher: do it here.
	w.explainLease(vol.driver, true, true)
}

// explainDriver reports whether the driver needs attaching at all.
func (w *walker) explainDriver(driver string) bool {
	obj := "CSIDriver " + driver
	d := w.csiDriver(driver)
	switch {
	case d == nil:
		ref := Ref{Kind: RefCSIDriver, Name: driver}
		if why, ok := w.unreadable(ref); ok {
			w.add(Finding{Check: "csidriver", Object: obj, Status: StatusInfo,
				Message: fmt.Sprintf("could not read CSIDriver %s (%s); assuming attach is required", driver, why)})
			return true
		}
		w.add(Finding{Check: "csidriver", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("no CSIDriver object %s: attach is required (the default); most drivers ship a CSIDriver object, so check the driver is installed", driver)})
		return true
	case d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired:
		w.add(Finding{Check: "csidriver", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("CSIDriver %s has attachRequired=false: no attach needed, no VolumeAttachment is created and the kubelet mounts the volume directly", driver)})
		return false
	}
	w.add(Finding{Check: "csidriver", Object: obj, Status: StatusOK,
		Message: fmt.Sprintf("CSIDriver %s requires attach", driver)})
	return true
}

// explainInline handles an in-tree inline Pod volume that CSI migration
// turns into an attachable CSI volume; it reports whether vol was one.
func (w *walker) explainInline(pod *v1.Pod, vol v1.Volume) bool {
	tr := csitrans.New()
	if !tr.IsInlineMigratable(&vol) {
		return false
	}
	obj := "Pod " + key(pod.Namespace, pod.Name)
	pv, err := tr.TranslateInTreeInlineVolumeToCSI(klog.Background(), &vol, pod.Namespace)
	if err != nil || pv == nil || pv.Spec.CSI == nil {
		w.add(Finding{Check: "volume.inline", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("inline volume %q cannot be translated to CSI: %v", vol.Name, err),
			Hint:    "fix the volume source in the Pod spec"})
		return true
	}
	w.add(Finding{Check: "volume.inline", Object: obj, Status: StatusOK,
		Message: fmt.Sprintf("inline in-tree volume %q is attached through CSI migration by driver %s (volume handle %s)", vol.Name, pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)})
	v := &volume{object: obj, driver: pv.Spec.CSI.Driver, handle: pv.Spec.CSI.VolumeHandle, modes: pv.Spec.AccessModes, inlinePod: pod}
	if !w.explainDriver(v.driver) {
		return true
	}
	v.attachRequired = true
	if pod.Spec.NodeName != "" {
		w.explainAttachment(v, pod.Spec.NodeName, nil)
	}
	return true
}

func (w *walker) inlineVolumeOfVA(va *storagev1.VolumeAttachment) *volume {
	obj := "VolumeAttachment " + va.Name
	pv := &v1.PersistentVolume{Spec: *va.Spec.Source.InlineVolumeSpec}
	csi := pv.Spec.CSI
	if csi == nil {
		translated, err := csitrans.New().TranslateInTreePVToCSI(klog.Background(), pv)
		if err != nil || translated == nil || translated.Spec.CSI == nil {
			w.add(Finding{Check: "va.source", Object: obj, Status: StatusProblem,
				Message: fmt.Sprintf("the inline volume spec cannot be translated to CSI: %v", err)})
			return nil
		}
		csi = translated.Spec.CSI
	}
	w.add(Finding{Check: "va.source", Object: obj, Status: StatusOK,
		Message: fmt.Sprintf("VolumeAttachment attaches an inline volume of driver %s, volume handle %s", csi.Driver, csi.VolumeHandle)})
	return &volume{object: obj, driver: csi.Driver, handle: csi.VolumeHandle, modes: pv.Spec.AccessModes, attachRequired: true}
}

// volumeFromAnnotations is what is left of a volume whose PV is gone: the
// handle csi-attacher recorded, if any.
func volumeFromAnnotations(va *storagev1.VolumeAttachment) *volume {
	vol := &volume{object: "VolumeAttachment " + va.Name, driver: va.Spec.Attacher, handle: va.Annotations[annVolumeHandle], attachRequired: true}
	if va.Spec.Source.PersistentVolumeName != nil {
		vol.pvName = *va.Spec.Source.PersistentVolumeName
	}
	return vol
}

// vasOf returns the VolumeAttachments of vol on any node: by PV name, by
// the handle csi-attacher recorded, or by the name the attach/detach
// controller would give them.
func (w *walker) vasOf(vol *volume) []*storagev1.VolumeAttachment {
	var out []*storagev1.VolumeAttachment
	for _, va := range w.vas() {
		if vaIsOf(va, vol) {
			out = append(out, va)
		}
	}
	return out
}

func vaIsOf(va *storagev1.VolumeAttachment, vol *volume) bool {
	if src := va.Spec.Source.PersistentVolumeName; src != nil && vol.pvName != "" {
		return *src == vol.pvName
	}
	if va.Spec.Attacher != vol.driver || vol.handle == "" {
		return false
	}
	return va.Annotations[annVolumeHandle] == vol.handle || va.Name == kubenames.VolumeAttachmentName(vol.handle, vol.driver, va.Spec.NodeName)
}

func (w *walker) vasOfPV(pv string) []*storagev1.VolumeAttachment {
	var out []*storagev1.VolumeAttachment
	for _, va := range w.vas() {
		if src := va.Spec.Source.PersistentVolumeName; src != nil && *src == pv {
			out = append(out, va)
		}
	}
	return out
}

// users returns the Pods that use vol and have not terminated; a Pod being
// deleted still counts, it holds the volume until the kubelet unmounts it.
func (w *walker) users(vol *volume) []*v1.Pod {
	var pods []*v1.Pod
	switch {
	case vol.inlinePod != nil:
		pods = []*v1.Pod{vol.inlinePod}
	case vol.claim != nil:
		pods = w.podsUsingClaim(vol.claim.Namespace, vol.claim.Name)
	}
	return slices.DeleteFunc(slices.Clone(pods), terminated)
}

// usersKnown reports whether users(vol) is meaningful: without a PVC there
// is no way to tell which Pods use a PV.
func usersKnown(vol *volume) bool { return vol.claim != nil || vol.inlinePod != nil }

// exclusive reports whether the volume may be attached to one node only:
// it has access modes and none of them is ReadWriteMany or ReadOnlyMany,
// the rule of the attach/detach controller's multi-attach check.
func exclusive(modes []v1.PersistentVolumeAccessMode) bool {
	if len(modes) == 0 {
		return false
	}
	return !slices.Contains(modes, v1.ReadWriteMany) && !slices.Contains(modes, v1.ReadOnlyMany)
}
