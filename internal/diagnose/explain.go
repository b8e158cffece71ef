package diagnose

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// Explain walks the attach pipeline from target and says where it stands.
// Reads the snapshot cannot answer count as "not found"; call Needs first
// (or build a complete snapshot) to avoid that.
func Explain(target Target, s *Snapshot) Report {
	w := newWalker(s)
	w.explain(target)
	return Report{Target: target, Findings: w.findings}
}

// Needs returns the reads Explain(target, s) would make that s cannot answer
// yet. A fetcher calls it in a loop, adds what it read (Snapshot.Add and
// Snapshot.MarkRead) and stops when it returns nothing; every round follows
// one more link of the pipeline (Pod → PVC → PV → ...), so a handful of
// rounds suffice.
func Needs(target Target, s *Snapshot) []Ref {
	w := newWalker(s)
	w.explain(target)
	refs := slices.Collect(maps.Keys(w.missing))
	slices.SortFunc(refs, func(a, b Ref) int { return strings.Compare(a.String(), b.String()) })
	return refs
}

func (w *walker) explain(t Target) {
	switch t.Kind {
	case TargetPod:
		w.explainPod(t.Namespace, t.Name)
	case TargetPVC:
		w.explainPVC(t.Namespace, t.Name)
	case TargetPV:
		w.explainPVTarget(t.Name)
	case TargetVA:
		w.explainVA(t.Name)
	default:
		w.add(Finding{Check: "target", Status: StatusProblem, Message: fmt.Sprintf("unknown kind %q", t.Kind),
			Hint: "use one of pod, pvc, pv, va"})
	}
}

func (w *walker) explainPod(namespace, name string) {
	obj := "Pod " + key(namespace, name)
	pod := w.pod(namespace, name)
	if pod == nil {
		w.add(w.notFound(Ref{Kind: RefPod, Namespace: namespace, Name: name}, "pod.exists", obj,
			fmt.Sprintf("Pod %s not found", key(namespace, name)),
			fmt.Sprintf("check the name and namespace: kubectl get pods -n %s", namespace)))
		return
	}
	if pod.DeletionTimestamp != nil {
		w.add(Finding{Check: "pod.deleting", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("Pod is being deleted (for %s); its volumes are detached after the kubelet has unmounted them", age(w.s.Now, pod.DeletionTimestamp.Time))})
	}
	if terminated(pod) {
		w.add(Finding{Check: "pod.terminated", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("Pod has terminated (phase %s): its volumes are no longer needed and may be detached", pod.Status.Phase)})
	}
	if pod.Spec.NodeName == "" {
		w.add(Finding{Check: "pod.scheduled", Object: obj, Status: StatusWaiting,
			Message: "Pod is not scheduled to a node yet; volumes are attached only after scheduling",
			Hint:    fmt.Sprintf("kubectl describe pod -n %s %s: read the FailedScheduling events (an unbound PVC or a volume node affinity are common causes)", namespace, name)})
	} else {
		w.add(Finding{Check: "pod.scheduled", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("Pod is scheduled to node %s", pod.Spec.NodeName)})
	}
	volumes := 0
	for _, vol := range pod.Spec.Volumes {
		if claim, ok := claimName(pod, vol); ok {
			volumes++
			w.explainClaim(namespace, claim, pod)
			continue
		}
		if vol.CSI != nil {
			w.add(Finding{Check: "volume.inline", Object: obj, Status: StatusOK,
				Message: fmt.Sprintf("volume %q is a CSI ephemeral inline volume of driver %s: it is never attached", vol.Name, vol.CSI.Driver)})
			continue
		}
		if w.explainInline(pod, vol) {
			volumes++
		}
	}
	if volumes == 0 {
		w.add(Finding{Check: "pod.volumes", Object: obj, Status: StatusOK,
			Message: "Pod uses no persistent volume: nothing to attach"})
	}
	w.explainEvents(RefPod, namespace, name, obj, podEventReasons())
}

func (w *walker) explainPVC(namespace, name string) {
	w.explainClaim(namespace, name, nil)
}

func (w *walker) explainPVTarget(name string) {
	obj := "PersistentVolume " + name
	pv := w.pv(name)
	if pv == nil {
		w.add(w.notFound(Ref{Kind: RefPV, Name: name}, "pv.exists", obj,
			fmt.Sprintf("PersistentVolume %s not found", name), "check the name: kubectl get pv"))
		return
	}
	var pvc *v1.PersistentVolumeClaim
	if ref := pv.Spec.ClaimRef; ref != nil {
		pvc = w.pvc(ref.Namespace, ref.Name)
		switch {
		case pvc == nil:
			w.add(Finding{Check: "pvc.exists", Object: obj, Status: StatusInfo,
				Message: fmt.Sprintf("PV is claimed by %s, which does not exist (phase %s)", key(ref.Namespace, ref.Name), pv.Status.Phase)})
		case ref.UID != "" && ref.UID != pvc.UID:
			w.add(Finding{Check: "pv.claimRef", Object: obj, Status: StatusInfo,
				Message: fmt.Sprintf("PV was bound to an earlier PVC %s (uid %s); the current one has uid %s", key(ref.Namespace, ref.Name), ref.UID, pvc.UID)})
			pvc = nil
		default:
			w.add(Finding{Check: "pv.claimRef", Object: obj, Status: StatusOK,
				Message: fmt.Sprintf("PV is bound to PVC %s (phase %s)", key(pvc.Namespace, pvc.Name), pvc.Status.Phase)})
		}
	} else {
		w.add(Finding{Check: "pv.claimRef", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("PV is not claimed by any PVC (phase %s)", pv.Status.Phase)})
	}
	vol := w.explainPV(pv, pvc)
	if vol == nil {
		return
	}
	w.explainNodes(vol)
}

// explainClaim follows one PVC to its PV and on to the nodes it is (to be)
// attached to. pod is the Pod being explained, or nil when the PVC is the
// target (then every Pod using it counts).
func (w *walker) explainClaim(namespace, name string, pod *v1.Pod) {
	obj := "PersistentVolumeClaim " + key(namespace, name)
	pvc := w.pvc(namespace, name)
	if pvc == nil {
		hint := fmt.Sprintf("create PVC %s, or fix the claim name in the Pod spec", key(namespace, name))
		if pod != nil && isEphemeralClaim(pod, name) {
			hint = "this is a generic ephemeral volume: the ephemeral-volume controller of kube-controller-manager creates the PVC; check it runs"
		}
		w.add(w.notFound(Ref{Kind: RefPVC, Namespace: namespace, Name: name}, "pvc.exists", obj,
			fmt.Sprintf("PVC %s not found", key(namespace, name)), hint))
		return
	}
	if pvc.DeletionTimestamp != nil {
		w.add(Finding{Check: "pvc.deleting", Object: obj, Status: StatusInfo,
			Message: "PVC is being deleted; kubernetes.io/pvc-protection keeps it while Pods use it"})
	}
	if pvc.Status.Phase == v1.ClaimLost {
		w.add(Finding{Check: "pvc.bound", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("PVC is Lost: its PersistentVolume %q is gone", pvc.Spec.VolumeName),
			Hint:    "the data is not reachable through this PVC any more; restore the PV (same name and volumeHandle) or re-create the PVC from a backup"})
		return
	}
	if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" {
		phase := pvc.Status.Phase
		if phase == "" {
			phase = v1.ClaimPending
		}
		w.add(Finding{Check: "pvc.bound", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("PVC %s is %s, not bound to a PersistentVolume yet; nothing is attached before binding", key(namespace, name), phase),
			Hint:    fmt.Sprintf("kubectl describe pvc -n %s %s: check StorageClass %q and the provisioner's events (with volumeBindingMode WaitForFirstConsumer the PVC binds only after the Pod is scheduled)", namespace, name, storageClass(pvc))})
		return
	}
	w.add(Finding{Check: "pvc.bound", Object: obj, Status: StatusOK,
		Message: fmt.Sprintf("PVC is bound to PersistentVolume %s", pvc.Spec.VolumeName)})

	pv := w.pv(pvc.Spec.VolumeName)
	if pv == nil {
		w.add(w.notFound(Ref{Kind: RefPV, Name: pvc.Spec.VolumeName}, "pv.exists", "PersistentVolume "+pvc.Spec.VolumeName,
			fmt.Sprintf("PersistentVolume %s not found although PVC %s is bound to it", pvc.Spec.VolumeName, key(namespace, name)),
			"the PV was deleted; re-create it with the same name and volumeHandle, or restore the data into a new PVC"))
		return
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != namespace || ref.Name != name || (ref.UID != "" && ref.UID != pvc.UID) {
		w.add(Finding{Check: "pv.claimRef", Object: "PersistentVolume " + pv.Name, Status: StatusProblem,
			Message: fmt.Sprintf("PV %s is bound to %s, not to PVC %s (uid %s): the attach/detach controller ignores the volume until binding is consistent", pv.Name, describeClaimRef(ref), key(namespace, name), pvc.UID),
			Hint:    fmt.Sprintf("fix spec.claimRef of PV %s, or re-create PVC %s so that the PV controller binds them again", pv.Name, key(namespace, name))})
		return
	}
	vol := w.explainPV(pv, pvc)
	if vol == nil {
		return
	}
	if pod == nil {
		w.explainNodes(vol)
		return
	}
	if pod.Spec.NodeName != "" {
		w.explainAttachment(vol, pod.Spec.NodeName, nil)
	}
}

// explainNodes explains the attachment of vol on every node that has a
// VolumeAttachment for it or a Pod that uses it.
func (w *walker) explainNodes(vol *volume) {
	nodes := map[string]bool{}
	for _, va := range w.vasOf(vol) {
		nodes[va.Spec.NodeName] = true
	}
	for _, pod := range w.users(vol) {
		if pod.Spec.NodeName != "" {
			nodes[pod.Spec.NodeName] = true
		}
	}
	if len(nodes) == 0 {
		w.add(Finding{Check: "volume.nodes", Object: vol.object, Status: StatusOK,
			Message: "no scheduled Pod uses the volume and no VolumeAttachment exists for it: nothing to attach or detach"})
		return
	}
	for _, node := range slices.Sorted(maps.Keys(nodes)) {
		w.explainAttachment(vol, node, nil)
	}
}

func (w *walker) explainVA(name string) {
	obj := "VolumeAttachment " + name
	va, ambiguous := w.va(name)
	if len(ambiguous) > 0 {
		w.add(Finding{Check: "va.exists", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("%q matches %d VolumeAttachments: %s", name, len(ambiguous), listNames(ambiguous, 5)),
			Hint:    "give more of the name (latchctl status -o wide prints full names)"})
		return
	}
	if va == nil {
		w.add(w.notFound(Ref{Kind: RefVAList}, "va.exists", obj,
			fmt.Sprintf("VolumeAttachment %s not found", name), "list them with: latchctl status"))
		return
	}
	vol := w.volumeOfVA(va)
	if vol == nil {
		return
	}
	w.explainAttachment(vol, va.Spec.NodeName, va)
}

// volumeOfVA resolves what a VolumeAttachment attaches, reporting the PV
// (and its PVC) along the way.
func (w *walker) volumeOfVA(va *storagev1.VolumeAttachment) *volume {
	obj := "VolumeAttachment " + va.Name
	src := va.Spec.Source
	switch {
	case src.PersistentVolumeName != nil && *src.PersistentVolumeName != "":
		pvName := *src.PersistentVolumeName
		pv := w.pv(pvName)
		if pv == nil {
			f := w.notFound(Ref{Kind: RefPV, Name: pvName}, "pv.exists", "PersistentVolume "+pvName,
				fmt.Sprintf("PersistentVolume %s, which the VolumeAttachment attaches, does not exist", pvName),
				"a VolumeAttachment of a deleted PV can still be detached: csi-attacher uses the volume-handle and node-id annotations it recorded at attach time")
			if va.DeletionTimestamp == nil {
				f.Status = StatusProblem
			} else {
				f.Status = StatusInfo
			}
			w.add(f)
			return volumeFromAnnotations(va)
		}
		var pvc *v1.PersistentVolumeClaim
		if ref := pv.Spec.ClaimRef; ref != nil {
			if c := w.pvc(ref.Namespace, ref.Name); c != nil && (ref.UID == "" || ref.UID == c.UID) {
				pvc = c
			}
		}
		return w.explainPV(pv, pvc)
	case src.InlineVolumeSpec != nil:
		return w.inlineVolumeOfVA(va)
	}
	w.add(Finding{Check: "va.source", Object: obj, Status: StatusProblem,
		Message: "spec.source names neither a PersistentVolume nor an inline volume",
		Hint:    "this VolumeAttachment was not written by the attach/detach controller; delete it"})
	return nil
}

func terminated(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

func isEphemeralClaim(pod *v1.Pod, claim string) bool {
	for _, vol := range pod.Spec.Volumes {
		if vol.Ephemeral != nil && pod.Name+"-"+vol.Name == claim {
			return true
		}
	}
	return false
}

func storageClass(pvc *v1.PersistentVolumeClaim) string {
	if pvc.Spec.StorageClassName != nil {
		return *pvc.Spec.StorageClassName
	}
	return ""
}

func describeClaimRef(ref *v1.ObjectReference) string {
	if ref == nil {
		return "no claim"
	}
	if ref.UID == "" {
		return "PVC " + key(ref.Namespace, ref.Name)
	}
	return fmt.Sprintf("PVC %s (uid %s)", key(ref.Namespace, ref.Name), ref.UID)
}

// notFound is the finding for a read that found nothing, or an info line
// when the read was refused (RBAC) so that the user is not told something
// is missing when it merely could not be seen.
func (w *walker) notFound(ref Ref, check, object, message, hint string) Finding {
	if why, ok := w.unreadable(ref); ok {
		return Finding{Check: check, Object: object, Status: StatusInfo,
			Message: fmt.Sprintf("could not read %s: %s", ref, why),
			Hint:    "grant get/list on that resource to check this step"}
	}
	return Finding{Check: check, Object: object, Status: StatusProblem, Message: message, Hint: hint}
}

func listNames(names []string, max int) string {
	if len(names) <= max {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:max], ", "), len(names)-max)
}
