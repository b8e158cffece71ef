package attacher

import (
	"fmt"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	csitrans "k8s.io/csi-translation-lib"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Transform is the informer transform the attacher of driver wants, for a
// shared informer factory. It runs on every object before it is cached and
// keeps only what the attacher reads:
//
//   - managed fields are dropped from every object;
//   - the kubectl.kubernetes.io/last-applied-configuration annotation is
//     dropped from PersistentVolumes and CSINodes (the attacher never writes
//     their annotations; VolumeAttachments keep all of theirs, because an
//     annotation patch is computed against the cached map);
//   - our VolumeAttachments lose their labels and owner references and
//     share one copy of the strings every one of them repeats (see
//     trimOwnVA);
//   - CSINodes keep only driver's entry in spec.drivers;
//   - VolumeAttachments of other attachers become a *ForeignVA placeholder
//     (name and resourceVersion): the attacher never reads them;
//   - our CSI PersistentVolumes keep only what the attach reads (see
//     trimOwnCSIPV);
//   - PersistentVolumes of other drivers are not cached as PVs at all but
//     as a *ForeignPV placeholder of a few dozen bytes (see ForeignPV),
//     unless they carry our finalizer: those are cut down to what the
//     attacher needs of them (see trimForeignPV). In-tree PVs of a plugin
//     migrated to driver count as ours and stay whole, since the attacher
//     translates their in-tree source.
//
// The result is idempotent, as client-go requires: a placeholder passes
// through unchanged and a trimmed PV is still recognised as another
// driver's. Because the PV and VolumeAttachment informers' stores may hold
// placeholders, their generated listers must not be used (they would panic
// on the type assertion): NewInformers hands out none, and they are read
// with its typed accessors, LookupPV and LookupVA.
func Transform(driver string) cache.TransformFunc {
	driverOf := DriverOfPV(csitrans.New())
	finalizer := kubenames.PVFinalizer(driver)
	vaFinalizer := kubenames.AttacherFinalizer(driver)
	sources := &sharedCSISources{m: map[string]*v1.CSIPersistentVolumeSource{}}
	return func(obj any) (any, error) {
		obj, err := kube.StripManagedFields(obj)
		if err != nil {
			return obj, err
		}
		switch o := obj.(type) {
		case *v1.PersistentVolume:
			if d := driverOf(o); d != driver {
				if !slices.Contains(o.Finalizers, finalizer) {
					return newForeignPV(o, sources.driverName(d)), nil
				}
				return trimForeignPV(o, d, finalizer, sources), nil
			}
			if o.Spec.CSI != nil {
				trimOwnCSIPV(o)
			} else {
				// Migrated in-tree PV: the translation may read any of it
				// (labels hold the zone of some in-tree disks).
				dropLastApplied(o)
			}
		case *storagev1.VolumeAttachment:
			if o.Spec.Attacher != driver {
				return &ForeignVA{Name: o.Name, ResourceVersion: o.ResourceVersion}, nil
			}
			trimOwnVA(o, driver, vaFinalizer)
		case *storagev1.CSINode:
			dropLastApplied(o)
			keepDriver(o, driver)
		}
		return obj, nil
	}
}

// trimForeignPV returns the part of another driver's PV (driver d, "" for
// a PV no CSI driver handles) that carries our finalizer (left behind by an
// earlier driver name, say) and that the attacher uses:
//
//   - name and resourceVersion: the cache key, and the version the
//     attacher's own-write bookkeeping compares;
//   - deletionTimestamp and finalizers: the PV queue removes our finalizer
//     from a deleting PV once no VolumeAttachment needs it, and patches
//     against the full list;
//   - spec.csi.driver of a CSI PV: a VolumeAttachment of ours that names it
//     is told which driver the PV belongs to. All PVs of one driver share a
//     single, read-only CSIPersistentVolumeSource.
//
// Everything else (uid, labels, annotations, claim reference, capacity,
// volume handle and attributes, in-tree sources, status) is dropped. Such
// PVs are rare; other drivers' PVs without our finalizer become a
// ForeignPV instead.
func trimForeignPV(pv *v1.PersistentVolume, d, finalizer string, sources *sharedCSISources) *v1.PersistentVolume {
	// Trimmed in place: the transform owns the object, and client-go may
	// pass an already trimmed PV through again (the watch-list reflector
	// transforms into its temporary store, the queue's Replace once more),
	// which then allocates nothing.
	meta := metav1.ObjectMeta{
		Name:              pv.Name,
		ResourceVersion:   pv.ResourceVersion,
		DeletionTimestamp: pv.DeletionTimestamp,
	}
	if slices.Contains(pv.Finalizers, finalizer) {
		meta.Finalizers = pv.Finalizers
	}
	var src v1.PersistentVolumeSource
	if pv.Spec.CSI != nil {
		src.CSI = sources.get(d)
	}
	pv.ObjectMeta = meta
	pv.Spec = v1.PersistentVolumeSpec{PersistentVolumeSource: src}
	pv.Status = v1.PersistentVolumeStatus{}
	return pv
}

// trimOwnCSIPV cuts a CSI PersistentVolume of this driver down, in place,
// to what the attacher reads of it: name, resourceVersion (own-write
// bookkeeping), deletion time and finalizers (the PV finalizer and its
// guarded patches), spec.csi (handle, attributes, secrets, fsType,
// read-only), access modes, volume mode and mount options (the volume
// capability). Labels, annotations, claim reference, capacity, node
// affinity, storage class and status are dropped: nothing in the attach or
// detach path reads them, and on a real cluster they are most of a PV.
func trimOwnCSIPV(pv *v1.PersistentVolume) {
	pv.ObjectMeta = metav1.ObjectMeta{
		Name:              pv.Name,
		ResourceVersion:   pv.ResourceVersion,
		DeletionTimestamp: pv.DeletionTimestamp,
		Finalizers:        pv.Finalizers,
	}
	pv.Spec = v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: pv.Spec.CSI},
		AccessModes:            pv.Spec.AccessModes,
		VolumeMode:             pv.Spec.VolumeMode,
		MountOptions:           pv.Spec.MountOptions,
	}
	pv.Status = v1.PersistentVolumeStatus{}
}

// trimOwnVA cuts a VolumeAttachment of this attacher down, in place, to
// what the attacher reads of it and computes its writes from. Little can
// go, because every write is computed against the cached object:
//
//   - name; UID (status patches carry it as a precondition, orphans tell a
//     replaced VolumeAttachment by it); resourceVersion (the guard of the
//     metadata patches, own-write bookkeeping); creation time (the
//     attach-latency metric); deletion time (detach);
//   - annotations, whole: the node ID, volume handle and secret reference
//     are read, and kube.SetAnnotationsPatch adds each key to the cached
//     map or, when the cached map is empty, writes the map whole. An
//     annotation dropped here (kubectl's last-applied copy, say) could
//     leave the cached map empty, and the attacher's next annotation patch
//     would then erase it on the server (the resourceVersion test passes);
//   - finalizers, whole: the finalizer patches test and replace the list;
//   - spec, whole: attacher, node, PV name or inline spec;
//   - status, whole: status writes are merge patches diffed against the
//     cached status (kube.VolumeAttachmentStatusPatch), attachmentMetadata
//     included; an attached VolumeAttachment is re-confirmed with its own
//     attachmentMetadata, and errors are compared before they are written.
//
// Labels, owner references, generateName and deletionGracePeriodSeconds are
// dropped: nothing reads them and no patch touches them. spec.attacher, our
// finalizer and the keys of our three annotations, which protobuf decoding
// gives every VolumeAttachment its own copy of, are replaced by one shared
// copy (equal strings, so nothing that reads them can tell).
func trimOwnVA(va *storagev1.VolumeAttachment, driver, finalizer string) {
	va.Labels, va.OwnerReferences, va.GenerateName, va.DeletionGracePeriodSeconds = nil, nil, "", nil
	va.Spec.Attacher = driver
	for i, f := range va.Finalizers {
		if f == finalizer {
			va.Finalizers[i] = finalizer
		}
	}
	shared := 0
	for k := range va.Annotations {
		if sharedAnnotationKey(k) != "" {
			shared++
		}
	}
	if shared == 0 {
		return
	}
	// Map keys cannot be replaced in place: the map is rebuilt, equal to
	// the old one (client-go may transform an object twice; the second
	// rebuild is a copy, garbage at once).
	ann := make(map[string]string, len(va.Annotations))
	for k, v := range va.Annotations {
		if s := sharedAnnotationKey(k); s != "" {
			k = s
		}
		ann[k] = v
	}
	va.Annotations = ann
}

// sharedAnnotationKey returns the constant for one of the annotation keys
// the attacher writes on its VolumeAttachments, "" for any other key.
func sharedAnnotationKey(k string) string {
	switch k {
	case kubenames.VANodeIDAnnotation:
		return kubenames.VANodeIDAnnotation
	case AnnVolumeHandle:
		return AnnVolumeHandle
	case AnnSecretRef:
		return AnnSecretRef
	}
	return ""
}

// ForeignPV stands in the PV informer's store for a PersistentVolume of
// another driver that does not carry our finalizer. The attacher never acts
// on such a PV; it only needs to know that it exists, whose it is (to tell
// a VolumeAttachment of ours that names it which driver it belongs to) and
// whether it is being deleted. Caching a whole (even emptied)
// v1.PersistentVolume for each of them cost about 700 bytes per PV, which
// in a cluster where most PVs belong to other drivers was most of the
// attacher's memory.
//
// ForeignPV is not a runtime.Object; client-go's store only needs its key
// and resourceVersion, which it reads through GetObjectMeta.
type ForeignPV struct {
	Name            string
	ResourceVersion string
	// Driver is the CSI driver that handles the PV ("" for an in-tree PV
	// no CSI driver handles); one string per driver name is shared.
	Driver            string
	DeletionTimestamp *metav1.Time
}

func newForeignPV(pv *v1.PersistentVolume, driver string) *ForeignPV {
	return &ForeignPV{Name: pv.Name, ResourceVersion: pv.ResourceVersion, Driver: driver, DeletionTimestamp: pv.DeletionTimestamp}
}

// GetObjectMeta lets client-go's key function and store read the name and
// resourceVersion (meta.Accessor accepts a metav1.ObjectMetaAccessor).
func (f *ForeignPV) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: f.Name, ResourceVersion: f.ResourceVersion, DeletionTimestamp: f.DeletionTimestamp}
}

// PV returns the minimal PersistentVolume the attacher's decisions need:
// name, deletion time and, for a CSI PV, spec.csi.driver.
func (f *ForeignPV) PV() *v1.PersistentVolume {
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: f.Name, ResourceVersion: f.ResourceVersion, DeletionTimestamp: f.DeletionTimestamp}}
	if f.Driver != "" {
		pv.Spec.CSI = &v1.CSIPersistentVolumeSource{Driver: f.Driver}
	}
	return pv
}

// LookupPV reads a PersistentVolume from a store filled through Transform:
// the PV itself, or for another driver's PV the minimal PV its placeholder
// stands for. A PV that is not there is a NotFound error, as from a lister.
func LookupPV(store cache.Store, name string) (*v1.PersistentVolume, error) {
	obj, exists, err := store.GetByKey(name)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, apierrors.NewNotFound(v1.Resource("persistentvolumes"), name)
	}
	pv, _, err := decodePV(obj)
	if err != nil {
		return nil, fmt.Errorf("%w under %q", err, name)
	}
	return pv, nil
}

// ForeignVA stands in the VolumeAttachment informer's store for a
// VolumeAttachment of another attacher, which this attacher never acts on.
// In a cluster with several CSI drivers most VolumeAttachments are other
// drivers'; keeping only the key and resourceVersion (what client-go's
// store reads, through GetObjectMeta) saves the whole object for each.
type ForeignVA struct {
	Name            string
	ResourceVersion string
}

// GetObjectMeta lets client-go's key function and store read the name and
// resourceVersion.
func (f *ForeignVA) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: f.Name, ResourceVersion: f.ResourceVersion}
}

// LookupVA reads a VolumeAttachment of this attacher from a store filled
// through Transform. Another attacher's VolumeAttachment (a placeholder)
// and a missing one are both nil with a nil error: neither is ours.
func LookupVA(store cache.Store, name string) (*storagev1.VolumeAttachment, error) {
	obj, exists, err := store.GetByKey(name)
	if err != nil || !exists {
		return nil, err
	}
	va, _, err := decodeVA(obj)
	if err != nil {
		return nil, fmt.Errorf("%w under %q", err, name)
	}
	return va, nil
}

// decodeVA is the kube.Decoder of the VolumeAttachment store: a
// ForeignVA placeholder is not ours (ok=false).
func decodeVA(obj any) (*storagev1.VolumeAttachment, bool, error) {
	switch o := obj.(type) {
	case *storagev1.VolumeAttachment:
		return o, true, nil
	case *ForeignVA:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("unexpected %T in the VolumeAttachment cache", obj)
}

// decodePV is the kube.Decoder of the PV store: a ForeignPV placeholder
// stands in as the minimal PV the decisions need (ForeignPV.PV).
func decodePV(obj any) (*v1.PersistentVolume, bool, error) {
	switch o := obj.(type) {
	case *v1.PersistentVolume:
		return o, true, nil
	case *ForeignPV:
		return o.PV(), true, nil
	}
	return nil, false, fmt.Errorf("unexpected %T in the PersistentVolume cache", obj)
}

// sharedCSISources hands out one CSIPersistentVolumeSource per driver name
// for trimmed PVs. It stops sharing (and allocates per PV) beyond
// maxSharedCSISources names, so a cluster with unusual driver names cannot
// grow it without bound.
type sharedCSISources struct {
	mu sync.Mutex
	m  map[string]*v1.CSIPersistentVolumeSource
}

const maxSharedCSISources = 256

// driverName returns the shared copy of a driver name, so placeholders of
// one driver's PVs do not each keep the string their PV was decoded with.
func (s *sharedCSISources) driverName(driver string) string {
	if driver == "" {
		return ""
	}
	return s.get(driver).Driver
}

func (s *sharedCSISources) get(driver string) *v1.CSIPersistentVolumeSource {
	s.mu.Lock()
	defer s.mu.Unlock()
	if src, ok := s.m[driver]; ok {
		return src
	}
	src := &v1.CSIPersistentVolumeSource{Driver: driver}
	if len(s.m) < maxSharedCSISources {
		s.m[driver] = src
	}
	return src
}

// lastAppliedAnnotation is kubectl's copy of the applied manifest; on
// objects created with kubectl apply it is often their largest field.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

func dropLastApplied(obj metav1.Object) {
	ann := obj.GetAnnotations()
	if _, ok := ann[lastAppliedAnnotation]; !ok {
		return
	}
	if len(ann) == 1 {
		obj.SetAnnotations(nil)
		return
	}
	delete(ann, lastAppliedAnnotation)
}

// keepDriver drops other drivers' entries from a CSINode: the attacher
// only looks up driver's node ID.
func keepDriver(node *storagev1.CSINode, driver string) {
	drivers := node.Spec.Drivers
	if len(drivers) == 0 || (len(drivers) == 1 && drivers[0].Name == driver) {
		return
	}
	var kept []storagev1.CSINodeDriver
	for _, d := range drivers {
		if d.Name == driver {
			kept = []storagev1.CSINodeDriver{d}
			break
		}
	}
	node.Spec.Drivers = kept
}

// DriverOfPV returns the CSI driver that handles a PV: spec.csi.driver, or
// for an in-tree PV the CSI driver its plugin migrates to ("" when none).
func DriverOfPV(tr InTreeNames) kube.PVDriverFunc {
	return func(pv *v1.PersistentVolume) string {
		if d := kube.CSIDriverOfPV(pv); d != "" {
			return d
		}
		plugin, err := tr.GetInTreePluginNameFromSpec(pv, nil)
		if err != nil || plugin == "" {
			return ""
		}
		d, err := tr.GetCSINameFromInTreeName(plugin)
		if err != nil {
			return ""
		}
		return d
	}
}

// InTreeNames maps in-tree volume sources to CSI driver names;
// csi-translation-lib's CSITranslator satisfies it.
type InTreeNames interface {
	GetInTreePluginNameFromSpec(pv *v1.PersistentVolume, vol *v1.Volume) (string, error)
	GetCSINameFromInTreeName(pluginName string) (string, error)
}
