package attacher

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// An object Transform never puts in a store is an error that names the
// store, the type and the key, not a PV or VA the caller would act on.
func TestLookupOfAnUnexpectedTypeNamesItAndTheKey(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := store.Add(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "odd"}}); err != nil {
		t.Fatal(err)
	}
	va, err := LookupVA(store, "odd")
	if want := `unexpected *v1.ConfigMap in the VolumeAttachment cache under "odd"`; va != nil || err == nil || err.Error() != want {
		t.Errorf("LookupVA = %v, %v; want nil and %q", va, err, want)
	}
	pv, err := LookupPV(store, "odd")
	if want := `unexpected *v1.ConfigMap in the PersistentVolume cache under "odd"`; pv != nil || err == nil || err.Error() != want {
		t.Errorf("LookupPV = %v, %v; want nil and %q", pv, err, want)
	}
}
