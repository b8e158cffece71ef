package controller

import (
	"strings"
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fresh returns a copy of s in its own memory, as each decoded object
// holds its own copy of every name.
func fresh(s string) string { return strings.Clone(s) }

func sameMemory(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// The names many cached objects repeat (namespace, node, driver) are held
// once however many objects carry them; the trimmed objects are equal to
// what they were without sharing.
func TestTrims_shareTheNamesObjectsRepeat(t *testing.T) {
	twice := func(t *testing.T, trim func(any) (any, error), make func() any) (any, any) {
		t.Helper()
		a, err := trim(make())
		if err != nil {
			t.Fatal(err)
		}
		b, err := trim(make())
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
	for _, tc := range []struct {
		name  string
		trim  func(any) (any, error)
		make  func() any
		names func(obj any) []string
		want  []string
	}{
		{
			name: "Pods of one namespace on one node",
			trim: TrimPod,
			make: func() any {
				p := podUsing("app", "node-a", "disk-1")
				p.Namespace, p.Spec.NodeName = fresh(testNS), fresh("node-a")
				return p
			},
			names: func(obj any) []string { p := obj.(*cachedPod); return []string{p.namespace, p.nodeName} },
			want:  []string{testNS, "node-a"},
		},
		{
			name: "claims of one namespace",
			trim: trimPVC,
			make: func() any {
				_, pvc := boundClaim("disk-1", v1.ReadWriteOnce)
				pvc.Namespace = fresh(testNS)
				return pvc
			},
			names: func(obj any) []string { return []string{obj.(*v1.PersistentVolumeClaim).Namespace} },
			want:  []string{testNS},
		},
		{
			name: "CSI PVs of one driver bound in one namespace",
			trim: trimPV,
			make: func() any {
				pv, _ := boundClaim("disk-1", v1.ReadWriteOnce)
				pv.Spec.CSI.Driver, pv.Spec.ClaimRef.Namespace = fresh(testDriver), fresh(testNS)
				return pv
			},
			names: func(obj any) []string {
				pv := obj.(*v1.PersistentVolume)
				return []string{pv.Spec.CSI.Driver, pv.Spec.ClaimRef.Namespace}
			},
			want: []string{testDriver, testNS},
		},
		{
			name: "VolumeAttachments of one driver on one node",
			trim: trimVA,
			make: func() any {
				pvName := "disk-1"
				return &storagev1.VolumeAttachment{
					ObjectMeta: metav1.ObjectMeta{Name: "csi-1"},
					Spec: storagev1.VolumeAttachmentSpec{Attacher: fresh(testDriver), NodeName: fresh("node-a"),
						Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
				}
			},
			names: func(obj any) []string {
				va := obj.(*storagev1.VolumeAttachment)
				return []string{va.Spec.Attacher, va.Spec.NodeName}
			},
			want: []string{testDriver, "node-a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := twice(t, tc.trim, tc.make)
			na, nb := tc.names(a), tc.names(b)
			for i := range tc.want {
				if na[i] != tc.want[i] || nb[i] != tc.want[i] {
					t.Errorf("name %d = %q and %q, want %q", i, na[i], nb[i], tc.want[i])
				}
				if !sameMemory(na[i], nb[i]) {
					t.Errorf("name %q is held twice", tc.want[i])
				}
			}
		})
	}
}
