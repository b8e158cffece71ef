package attacher

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// The attacher's informers hold another attacher's VolumeAttachment and
// another driver's PV as placeholders. Read through Informers, each comes
// back as what it is: ours whole, theirs as the placeholder, nothing for a
// name not there. A generated lister on the same stores (which Informers
// does not hand out) panics on the placeholders; that is what the typed
// accessors are for.
func TestInformers_placeholdersComeBackAsWhatTheyAre(t *testing.T) {
	const driver = "ours.csi.latch.dev"
	pvName := "pv-ours"
	ourPV := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName, ResourceVersion: "1"},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "h1"}}}}
	theirPV := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-theirs", ResourceVersion: "2"},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "theirs.csi.example.com", VolumeHandle: "h2"}}}}
	ourVA := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-ours", ResourceVersion: "3", Finalizers: []string{kubenames.AttacherFinalizer(driver)}},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: "n1", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}}
	theirVA := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-theirs", ResourceVersion: "4"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "theirs.csi.example.com", NodeName: "n1", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}}

	ctx, cancel := context.WithCancel(t.Context())
	inf := NewInformers(fake.NewClientset(ourPV, theirPV, ourVA, theirVA), 0, driver)
	inf.Start(ctx.Done())
	t.Cleanup(func() { cancel(); inf.Shutdown() })
	for typ, ok := range inf.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("cache of %v did not sync", typ)
		}
	}

	if va, foreign, err := inf.VolumeAttachment("va-ours"); err != nil || foreign != nil || va == nil || va.Spec.Attacher != driver {
		t.Errorf("VolumeAttachment(va-ours) = %v, %v, %v; want ours whole", va, foreign, err)
	}
	if va, foreign, err := inf.VolumeAttachment("va-theirs"); err != nil || va != nil || foreign == nil || foreign.Name != "va-theirs" || foreign.ResourceVersion != "4" {
		t.Errorf("VolumeAttachment(va-theirs) = %v, %+v, %v; want its ForeignVA placeholder", va, foreign, err)
	}
	if va, foreign, err := inf.VolumeAttachment("va-none"); err != nil || va != nil || foreign != nil {
		t.Errorf("VolumeAttachment(va-none) = %v, %v, %v; want nothing", va, foreign, err)
	}
	if pv, foreign, err := inf.PersistentVolume(pvName); err != nil || foreign != nil || pv == nil || pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != "h1" {
		t.Errorf("PersistentVolume(%s) = %v, %v, %v; want ours", pvName, pv, foreign, err)
	}
	if pv, foreign, err := inf.PersistentVolume("pv-theirs"); err != nil || pv != nil || foreign == nil || foreign.Driver != "theirs.csi.example.com" {
		t.Errorf("PersistentVolume(pv-theirs) = %v, %+v, %v; want its ForeignPV placeholder naming its driver", pv, foreign, err)
	}

	stores := inf.ByKind()
	panics := func(what string, get func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("a generated %s lister read a placeholder without panicking: the typed accessors would not be needed", what)
			}
		}()
		get()
	}
	panics("VolumeAttachment", func() { _, _ = storagelisters.NewVolumeAttachmentLister(stores["VA"].GetIndexer()).Get("va-theirs") })
	panics("PersistentVolume", func() { _, _ = corelisters.NewPersistentVolumeLister(stores["PV"].GetIndexer()).Get("pv-theirs") })
}
