package attacher

import (
	"reflect"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
)

// Informers are the informers the attacher of one driver runs on, made
// only by NewInformers: every object goes through Transform before it is
// cached, so the VolumeAttachment and PersistentVolume stores hold trimmed
// objects and placeholders (ForeignVA, ForeignPV) beside whole objects.
// Their generated listers would panic on a placeholder (a typed Get
// asserts *v1.PersistentVolume), so Informers hands out none: it is not an
// informers.SharedInformerFactory, and its only readers of those two
// stores decode every entry to what it is (VolumeAttachment,
// PersistentVolume; the Controller reads through kube.OverlaidStore with
// the same decoders). CSINodes are trimmed but never replaced, so their
// lister is safe.
type Informers struct {
	factory       informers.SharedInformerFactory
	vas, pvs      cache.SharedIndexInformer
	csiNodes      cache.SharedIndexInformer
	csiNodeLister storagelisters.CSINodeLister
}

// NewInformers returns the informers of the attacher of driver: every
// informer gets Transform(driver), and the three the attacher uses
// (VolumeAttachments, PersistentVolumes, CSINodes) are built without
// client-go's default namespace index. All three kinds are cluster-scoped,
// so that index would hold every key under "" and serve no lookup, at
// about 40 bytes per cached object.
func NewInformers(client kubernetes.Interface, resync time.Duration, driver string) *Informers {
	f := informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithTransform(Transform(driver)))
	i := &Informers{factory: f}
	i.vas = f.InformerFor(&storagev1.VolumeAttachment{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return storageinformers.NewVolumeAttachmentInformer(c, resync, cache.Indexers{})
	})
	i.pvs = f.InformerFor(&v1.PersistentVolume{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewPersistentVolumeInformer(c, resync, cache.Indexers{})
	})
	i.csiNodes = f.InformerFor(&storagev1.CSINode{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return storageinformers.NewCSINodeInformer(c, resync, cache.Indexers{})
	})
	i.csiNodeLister = storagelisters.NewCSINodeLister(i.csiNodes.GetIndexer())
	return i
}

// Start starts the informers (after New wired the Controller's handlers).
func (i *Informers) Start(stop <-chan struct{}) { i.factory.Start(stop) }

// Shutdown stops them and waits for their goroutines.
func (i *Informers) Shutdown() { i.factory.Shutdown() }

// WaitForCacheSync waits until every started informer has synced.
func (i *Informers) WaitForCacheSync(stop <-chan struct{}) map[reflect.Type]bool {
	return i.factory.WaitForCacheSync(stop)
}

// VolumeAttachment reads the entry under name: a VolumeAttachment of ours,
// whole (va), or another attacher's placeholder (foreign); neither when
// there is none. An entry Transform never makes is an error naming it.
func (i *Informers) VolumeAttachment(name string) (va *storagev1.VolumeAttachment, foreign *ForeignVA, err error) {
	obj, exists, err := i.vas.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil, nil, err
	}
	if f, ok := obj.(*ForeignVA); ok {
		return nil, f, nil
	}
	va, err = LookupVA(i.vas.GetStore(), name)
	return va, nil, err
}

// PersistentVolume reads the entry under name: a PersistentVolume, whole
// or trimmed (pv), or another driver's placeholder (foreign); neither when
// there is none.
func (i *Informers) PersistentVolume(name string) (pv *v1.PersistentVolume, foreign *ForeignPV, err error) {
	obj, exists, err := i.pvs.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil, nil, err
	}
	if f, ok := obj.(*ForeignPV); ok {
		return nil, f, nil
	}
	pv, err = LookupPV(i.pvs.GetStore(), name)
	return pv, nil, err
}

// ByKind returns the three informers by kind ("VA", "PV", "CSINode"), for
// measuring what their stores hold (bench): their entries are not all API
// objects; read them through VolumeAttachment and PersistentVolume.
func (i *Informers) ByKind() map[string]cache.SharedIndexInformer {
	return map[string]cache.SharedIndexInformer{"VA": i.vas, "PV": i.pvs, "CSINode": i.csiNodes}
}
