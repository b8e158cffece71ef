package diagnose

import (
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// walker reads a snapshot for one walk and remembers the reads the snapshot
// could not answer; Needs returns them and Explain treats them as "not
// found" (after Needs reached a fixed point there are none left).
type walker struct {
	s        *Snapshot
	missing  map[Ref]bool
	findings []Finding
	// drivers whose csi-attacher Lease was already checked, so that a Pod
	// with ten volumes of one driver gets one Lease line.
	leaseChecked map[string]bool
	// eventsShown dedupes events of objects reached twice.
	eventsShown map[string]bool
}

func newWalker(s *Snapshot) *walker {
	return &walker{s: s, missing: map[Ref]bool{}, leaseChecked: map[string]bool{}, eventsShown: map[string]bool{}}
}

func (w *walker) add(f Finding) { w.findings = append(w.findings, f) }

// known reports whether ref's answer is in the snapshot, recording a miss
// when it is not.
func (w *walker) known(ref Ref, present bool) bool {
	if present || w.s.Complete {
		return true
	}
	if _, ok := w.s.Unreadable[ref]; ok {
		return true
	}
	w.missing[ref] = true
	return false
}

// unreadable returns why ref could not be read, if it could not.
func (w *walker) unreadable(ref Ref) (string, bool) {
	why, ok := w.s.Unreadable[ref]
	return why, ok
}

func get[T any](w *walker, m map[string]*T, ref Ref) *T {
	obj, ok := m[key(ref.Namespace, ref.Name)]
	w.known(ref, ok)
	return obj
}

func (w *walker) pod(namespace, name string) *v1.Pod {
	return get(w, w.s.Pods, Ref{Kind: RefPod, Namespace: namespace, Name: name})
}

func (w *walker) pvc(namespace, name string) *v1.PersistentVolumeClaim {
	return get(w, w.s.PVCs, Ref{Kind: RefPVC, Namespace: namespace, Name: name})
}

func (w *walker) pv(name string) *v1.PersistentVolume {
	return get(w, w.s.PVs, Ref{Kind: RefPV, Name: name})
}

func (w *walker) node(name string) *v1.Node {
	return get(w, w.s.Nodes, Ref{Kind: RefNode, Name: name})
}

func (w *walker) csiNode(name string) *storagev1.CSINode {
	return get(w, w.s.CSINodes, Ref{Kind: RefCSINode, Name: name})
}

func (w *walker) csiDriver(name string) *storagev1.CSIDriver {
	return get(w, w.s.CSIDrivers, Ref{Kind: RefCSIDriver, Name: name})
}

// podsUsingClaim returns the Pods of namespace that reference the claim,
// directly or as a generic ephemeral volume, sorted by name.
func (w *walker) podsUsingClaim(namespace, claim string) []*v1.Pod {
	ref := Ref{Kind: RefPodList, Namespace: namespace}
	if !w.known(ref, w.s.PodsListed[namespace]) {
		return nil
	}
	var out []*v1.Pod
	for _, pod := range w.s.Pods {
		if pod == nil || pod.Namespace != namespace {
			continue
		}
		for _, vol := range pod.Spec.Volumes {
			if name, ok := claimName(pod, vol); ok && name == claim {
				out = append(out, pod)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b *v1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// vas returns every VolumeAttachment, sorted by name.
func (w *walker) vas() []*storagev1.VolumeAttachment {
	if !w.known(Ref{Kind: RefVAList}, w.s.VAsListed) {
		return nil
	}
	out := make([]*storagev1.VolumeAttachment, 0, len(w.s.VAs))
	for _, va := range w.s.VAs {
		if va != nil {
			out = append(out, va)
		}
	}
	slices.SortFunc(out, func(a, b *storagev1.VolumeAttachment) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// va returns the VolumeAttachment called name, or the only one whose name
// starts with name; ambiguous reports a prefix matching several.
func (w *walker) va(name string) (va *storagev1.VolumeAttachment, ambiguous []string) {
	all := w.vas()
	for _, va := range all {
		if va.Name == name {
			return va, nil
		}
	}
	var matches []*storagev1.VolumeAttachment
	for _, va := range all {
		if strings.HasPrefix(va.Name, name) {
			matches = append(matches, va)
		}
	}
	switch len(matches) {
	case 0:
		return nil, nil
	case 1:
		return matches[0], nil
	}
	for _, m := range matches {
		ambiguous = append(ambiguous, m.Name)
	}
	return nil, ambiguous
}

func (w *walker) leases(name string) ([]*coordinationv1.Lease, Ref) {
	ref := Ref{Kind: RefLeaseList, Name: name}
	leases, ok := w.s.Leases[name]
	w.known(ref, ok)
	return leases, ref
}

// events returns the events about one object. Events about cluster-scoped
// objects (namespace "") land in whatever namespace the recorder chose
// ("default" for client-go), so they are keyed by involvedObject only.
func (w *walker) events(kind RefKind, namespace, name string) ([]*v1.Event, Ref) {
	ref := Ref{Kind: RefEventList, Of: kind, Namespace: namespace, Name: name}
	evs, ok := w.s.Events[eventKey(kind, namespace, name)]
	w.known(ref, ok)
	return evs, ref
}

// claimName returns the PVC a Pod volume uses: its persistentVolumeClaim,
// or the "<pod>-<volume>" claim of a generic ephemeral volume.
func claimName(pod *v1.Pod, vol v1.Volume) (string, bool) {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName, true
	case vol.Ephemeral != nil:
		return pod.Name + "-" + vol.Name, true
	}
	return "", false
}
