package diagnose

import (
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TargetKind is what `latchctl explain` was asked about.
type TargetKind string

const (
	TargetPod TargetKind = "pod"
	TargetPVC TargetKind = "pvc"
	TargetPV  TargetKind = "pv"
	TargetVA  TargetKind = "va"
)

// Target names the object to explain. Namespace is empty for PVs and
// VolumeAttachments. A VolumeAttachment may be named by a unique prefix of
// its name (status tables shorten the 68-character names).
type Target struct {
	Kind      TargetKind `json:"kind"`
	Namespace string     `json:"namespace,omitempty"`
	Name      string     `json:"name"`
}

func (t Target) String() string {
	if t.Namespace == "" {
		return fmt.Sprintf("%s %s", t.Kind, t.Name)
	}
	return fmt.Sprintf("%s %s/%s", t.Kind, t.Namespace, t.Name)
}

// RefKind is a kind of object, or list of objects, a diagnosis reads.
type RefKind string

const (
	RefPod       RefKind = "Pod"
	RefPVC       RefKind = "PersistentVolumeClaim"
	RefPV        RefKind = "PersistentVolume"
	RefNode      RefKind = "Node"
	RefCSINode   RefKind = "CSINode"
	RefCSIDriver RefKind = "CSIDriver"
	// RefVA is only used as the Of of a RefEventList: VolumeAttachments
	// are always read as a list.
	RefVA RefKind = "VolumeAttachment"
	// RefPodList is every Pod of Namespace (to find who uses a PVC).
	RefPodList RefKind = "PodList"
	// RefVAList is every VolumeAttachment (cluster-scoped, and needed to
	// find conflicts and the VAs that hold a PV).
	RefVAList RefKind = "VolumeAttachmentList"
	// RefLeaseList is every Lease called Name, in any namespace: the
	// attacher's namespace is whatever its deployment chose.
	RefLeaseList RefKind = "LeaseList"
	// RefEventList is the events whose involvedObject is Of Namespace/Name.
	RefEventList RefKind = "EventList"
	// RefAttacherPodList is every Pod, in any namespace, with a csi-attacher
	// container (IsAttacherPod): read only when no Lease shows an attacher.
	RefAttacherPodList RefKind = "AttacherPodList"
)

// Ref identifies one read.
type Ref struct {
	Kind      RefKind
	Namespace string
	Name      string
	// Of is the involvedObject kind of a RefEventList.
	Of RefKind
}

func (r Ref) String() string {
	var b strings.Builder
	b.WriteString(string(r.Kind))
	if r.Of != "" {
		b.WriteString(" of " + string(r.Of))
	}
	if r.Namespace != "" || r.Name != "" {
		b.WriteString(" " + key(r.Namespace, r.Name))
	}
	return b.String()
}

func key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Snapshot is what a diagnosis is made from. For single objects, a key that
// is present with a nil value means "looked up, not found"; an absent key
// means "not looked up" unless Complete is set. Objects in the snapshot are
// never modified.
type Snapshot struct {
	// Now is the time ages and staleness are measured against.
	Now time.Time

	Pods       map[string]*v1.Pod                   // namespace/name
	PVCs       map[string]*v1.PersistentVolumeClaim // namespace/name
	PVs        map[string]*v1.PersistentVolume
	Nodes      map[string]*v1.Node
	CSINodes   map[string]*storagev1.CSINode
	CSIDrivers map[string]*storagev1.CSIDriver
	VAs        map[string]*storagev1.VolumeAttachment

	// PodsListed holds the namespaces whose Pods are all in Pods.
	PodsListed map[string]bool
	// VAsListed says VAs holds every VolumeAttachment.
	VAsListed bool
	// AttacherPodsListed says Pods holds every Pod with a csi-attacher
	// container (IsAttacherPod), in every namespace.
	AttacherPodsListed bool
	// Leases maps a Lease name to the Leases of that name, any namespace;
	// a present key with no Leases means none exists.
	Leases map[string][]*coordinationv1.Lease
	// Events maps eventKey(kind, namespace, name) to the events about
	// that object.
	Events map[string][]*v1.Event
	// Unreadable records reads that failed for a reason other than "not
	// found" (typically RBAC); the checks that need them say so instead of
	// guessing.
	Unreadable map[Ref]string

	// Complete says that whatever is absent does not exist: tests build
	// snapshots this way. A fetcher leaves it false and fills the snapshot
	// through Needs.
	Complete bool
}

// NewSnapshot returns a complete snapshot holding objs (Pods, PVCs, PVs,
// Nodes, CSINodes, CSIDrivers, VolumeAttachments, Leases and Events).
func NewSnapshot(now time.Time, objs ...runtime.Object) *Snapshot {
	s := EmptySnapshot(now)
	s.Complete = true
	s.VAsListed = true
	for _, obj := range objs {
		s.Add(obj)
	}
	return s
}

// EmptySnapshot returns a snapshot that knows nothing yet.
func EmptySnapshot(now time.Time) *Snapshot {
	return &Snapshot{
		Now:        now,
		Pods:       map[string]*v1.Pod{},
		PVCs:       map[string]*v1.PersistentVolumeClaim{},
		PVs:        map[string]*v1.PersistentVolume{},
		Nodes:      map[string]*v1.Node{},
		CSINodes:   map[string]*storagev1.CSINode{},
		CSIDrivers: map[string]*storagev1.CSIDriver{},
		VAs:        map[string]*storagev1.VolumeAttachment{},
		PodsListed: map[string]bool{},
		Leases:     map[string][]*coordinationv1.Lease{},
		Events:     map[string][]*v1.Event{},
		Unreadable: map[Ref]string{},
	}
}

// Add stores one object; unknown types are ignored.
func (s *Snapshot) Add(obj runtime.Object) {
	switch o := obj.(type) {
	case *v1.Pod:
		s.Pods[key(o.Namespace, o.Name)] = o
	case *v1.PersistentVolumeClaim:
		s.PVCs[key(o.Namespace, o.Name)] = o
	case *v1.PersistentVolume:
		s.PVs[o.Name] = o
	case *v1.Node:
		s.Nodes[o.Name] = o
	case *storagev1.CSINode:
		s.CSINodes[o.Name] = o
	case *storagev1.CSIDriver:
		s.CSIDrivers[o.Name] = o
	case *storagev1.VolumeAttachment:
		s.VAs[o.Name] = o
	case *coordinationv1.Lease:
		s.Leases[o.Name] = append(s.Leases[o.Name], o)
	case *v1.Event:
		k := eventKey(RefKind(o.InvolvedObject.Kind), o.InvolvedObject.Namespace, o.InvolvedObject.Name)
		s.Events[k] = append(s.Events[k], o)
	}
}

func eventKey(kind RefKind, namespace, name string) string {
	return string(kind) + "/" + key(namespace, name)
}

// MarkRead records the outcome of a read of ref that found nothing or only
// list members already stored with Add, so that Needs stops asking for it.
func (s *Snapshot) MarkRead(ref Ref) {
	switch ref.Kind {
	case RefPod:
		setIfAbsent(s.Pods, key(ref.Namespace, ref.Name))
	case RefPVC:
		setIfAbsent(s.PVCs, key(ref.Namespace, ref.Name))
	case RefPV:
		setIfAbsent(s.PVs, ref.Name)
	case RefNode:
		setIfAbsent(s.Nodes, ref.Name)
	case RefCSINode:
		setIfAbsent(s.CSINodes, ref.Name)
	case RefCSIDriver:
		setIfAbsent(s.CSIDrivers, ref.Name)
	case RefPodList:
		s.PodsListed[ref.Namespace] = true
	case RefVAList:
		s.VAsListed = true
	case RefAttacherPodList:
		s.AttacherPodsListed = true
	case RefLeaseList:
		if _, ok := s.Leases[ref.Name]; !ok {
			s.Leases[ref.Name] = nil
		}
	case RefEventList:
		k := eventKey(ref.Of, ref.Namespace, ref.Name)
		if _, ok := s.Events[k]; !ok {
			s.Events[k] = nil
		}
	}
}

func setIfAbsent[T any](m map[string]*T, k string) {
	if _, ok := m[k]; !ok {
		m[k] = nil
	}
}
