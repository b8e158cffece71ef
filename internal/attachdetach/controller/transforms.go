package controller

import (
	"unique"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	csitrans "k8s.io/csi-translation-lib"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// The informers' transforms keep, of each object, what the controller
// reads and drop the rest before the object is cached: Pods and claims are
// the largest objects it holds (one of each per volume), and most of a Pod
// (containers, labels, annotations, service-account and config volumes,
// most of its status) plays no part in attach/detach. Each returns a new
// object, so running it twice gives the same result; a tombstone is
// returned as it is (it holds an object trimmed when cached).
//
// What is kept, and who reads it:
//   - Pod (a cachedPod, see podcache.go): name, namespace, UID,
//     resourceVersion (events), spec.nodeName, the volumes that may be
//     attachable (every kind but emptyDir, secret, configMap, downwardAPI,
//     projected, hostPath and image, which no CSI driver attaches), when
//     it was scheduled (the schedule-to-attach metric) and whether it
//     terminated (volume.PodTerminated of the whole Pod);
//   - claim metadata: name, namespace, UID, resourceVersion, timestamps
//     and owner references (a generic ephemeral volume's claim must be
//     controlled by its Pod);
//   - claim: spec.volumeName and status.phase;
//   - CSI PersistentVolume (see trimPV): name, UID, resourceVersion,
//     spec.csi.driver and volumeHandle, access modes, the claim reference's
//     namespace, name and UID; in-tree PVs of a plugin csi-translation-lib
//     can translate stay whole (but for managed fields);
//   - VolumeAttachment (the controller only creates and deletes them, never
//     writes one it read): name, UID, resourceVersion, timestamps, the whole
//     spec, status.attached, attachError and detachError;
//   - Node: name, UID, resourceVersion, timestamps, the controller-managed
//     annotation, taints, the Ready condition, volumesAttached and
//     volumesInUse (not its images, addresses, capacity or node info).

// mayBeAttachable is false for the volume kinds no CSI driver attaches.
func mayBeAttachable(v *v1.Volume) bool {
	s := &v.VolumeSource
	return s.EmptyDir == nil && s.Secret == nil && s.ConfigMap == nil && s.DownwardAPI == nil &&
		s.Projected == nil && s.HostPath == nil && s.Image == nil
}

// trimPVC is the PersistentVolumeClaim informer's transform.
func trimPVC(obj any) (any, error) {
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok || len(pvc.Spec.AccessModes) == 0 {
		// A tombstone, or a claim trimmed already (the API server admits
		// no claim without access modes).
		return obj, nil
	}
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: pvc.Name, Namespace: intern(pvc.Namespace), UID: pvc.UID, ResourceVersion: pvc.ResourceVersion,
			CreationTimestamp: pvc.CreationTimestamp, DeletionTimestamp: pvc.DeletionTimestamp,
			OwnerReferences: pvc.OwnerReferences,
		},
		Spec:   v1.PersistentVolumeClaimSpec{VolumeName: pvc.Spec.VolumeName},
		Status: v1.PersistentVolumeClaimStatus{Phase: pvc.Status.Phase},
	}, nil
}

var _ cache.TransformFunc = trimPVC

// trimPV is the PersistentVolume informer's transform. What the
// controller reads of a PV, and who reads it:
//   - name (the cache key, the VolumeAttachment's spec.source and the
//     events' "volume" name), UID (pvChanged tells a re-created PV from an
//     update) and resourceVersion;
//   - spec.claimRef's namespace, name and UID: volume.Resolver binds a
//     claim only to the PV whose claimRef.uid is the claim's, and pvChanged
//     and the driver wake find the claim's Pods by namespace/name;
//   - spec.csi.driver and volumeHandle: the volume's unique name, the
//     VolumeAttachment's attacher and name, the PV-by-driver index;
//   - spec.accessModes: whether the volume may be attached to several
//     nodes (volume.MultiAttachAllowed);
//   - which volume source the spec has (CSI, a migratable in-tree one, or
//     iSCSI, FC and FlexVolume, which are reported as unsupported).
//
// The controller never writes a PV and creates VolumeAttachments that name
// the PV only (spec.source.persistentVolumeName), so nothing else of a CSI
// PV is read: its labels, annotations, finalizers, capacity, volume
// attributes, secrets references, fsType, node affinity, storage class,
// mount options and status are dropped. An in-tree PV that
// csi-translation-lib can translate (IsPVMigratable) is kept whole, but
// for managed fields: its translation reads the in-tree source, the name,
// labels (the zone of GCE PD and vSphere disks), annotations (Azure File's
// resource group, Portworx's secret), access modes and node affinity, and
// what it reads changes with the library. Any other non-CSI PV (NFS,
// local, iSCSI...) keeps the name, UID, resourceVersion, claim reference,
// access modes and its volume source, which says whether latch attaches it.
//
// A CSI or other non-migratable PV becomes a new object; running trimPV on
// its result gives an equal one. A tombstone is returned as it is.
func trimPV(obj any) (any, error) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return obj, nil
	}
	if pv.Spec.CSI == nil && pvTranslator.IsPVMigratable(pv) {
		return kube.StripManagedFields(pv)
	}
	out := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv.Name, UID: pv.UID, ResourceVersion: pv.ResourceVersion},
		Spec:       v1.PersistentVolumeSpec{AccessModes: pv.Spec.AccessModes},
	}
	if csi := pv.Spec.CSI; csi != nil {
		out.Spec.CSI = &v1.CSIPersistentVolumeSource{Driver: intern(csi.Driver), VolumeHandle: csi.VolumeHandle}
	} else {
		out.Spec.PersistentVolumeSource = pv.Spec.PersistentVolumeSource
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		out.Spec.ClaimRef = &v1.ObjectReference{Namespace: intern(ref.Namespace), Name: ref.Name, UID: ref.UID}
	}
	return out, nil
}

var _ cache.TransformFunc = trimPV

// intern returns the one shared copy of s. The names that the cached
// objects of a cluster repeat (namespaces, node names, driver names) are
// then held once, not once per Pod, claim, PV and VolumeAttachment as
// each decode allocates them; the trims only use it for such names, since
// a name only one object carries would cost an entry in unique's table.
func intern(s string) string { return unique.Make(s).Value() }

// pvTranslator answers trimPV's IsPVMigratable; csi-translation-lib's
// translator holds no state.
var pvTranslator = csitrans.New()

// trimVA is the VolumeAttachment informer's transform (after the
// coexistence guard read its managed fields).
func trimVA(obj any) (any, error) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return obj, nil
	}
	spec := va.Spec
	spec.Attacher, spec.NodeName = intern(spec.Attacher), intern(spec.NodeName)
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name: va.Name, UID: va.UID, ResourceVersion: va.ResourceVersion,
			CreationTimestamp: va.CreationTimestamp, DeletionTimestamp: va.DeletionTimestamp,
		},
		Spec: spec,
		Status: storagev1.VolumeAttachmentStatus{
			Attached: va.Status.Attached, AttachError: va.Status.AttachError, DetachError: va.Status.DetachError,
		},
	}, nil
}

var _ cache.TransformFunc = trimVA

// trimNode is the Node informer's transform (after the coexistence guard
// read its managed fields).
func trimNode(obj any) (any, error) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return obj, nil
	}
	out := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion,
			CreationTimestamp: node.CreationTimestamp, DeletionTimestamp: node.DeletionTimestamp,
		},
		Spec: v1.NodeSpec{Taints: node.Spec.Taints},
		Status: v1.NodeStatus{
			VolumesAttached: node.Status.VolumesAttached,
			VolumesInUse:    node.Status.VolumesInUse,
		},
	}
	if v, ok := node.Annotations[kubenames.ControllerManagedAttachAnnotation]; ok {
		out.Annotations = map[string]string{kubenames.ControllerManagedAttachAnnotation: v}
	}
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			out.Status.Conditions = []v1.NodeCondition{{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}}
		}
	}
	return out, nil
}

var _ cache.TransformFunc = trimNode

// CSINodes are read for one thing only: the migrated-plugins annotation
// that says whether the kubelet of a node handles an in-tree plugin
// through CSI (Config.MigrationByNode).

// trimCSINode is the CSINode informer's transform: it keeps the name (the
// cache key), the resourceVersion and the migrated-plugins annotation, and
// drops the rest (the per-driver entries, which grow with the drivers
// installed on the node and which the controller never reads). The result
// is a new object, so running it twice gives the same result.
func trimCSINode(obj any) (any, error) {
	cn, ok := obj.(*storagev1.CSINode)
	if !ok {
		// Tombstones hold an object that was trimmed when it was cached.
		return obj, nil
	}
	out := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: cn.Name, ResourceVersion: cn.ResourceVersion}}
	if v, ok := cn.Annotations[v1.MigratedPluginsAnnotationKey]; ok {
		out.Annotations = map[string]string{v1.MigratedPluginsAnnotationKey: v}
	}
	return out, nil
}

var _ cache.TransformFunc = trimCSINode
