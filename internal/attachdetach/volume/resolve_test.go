package volume_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// fakeObjects is a map-backed volume.Objects.
type fakeObjects struct {
	pvcs    map[string]*v1.PersistentVolumeClaim // "ns/name"
	pvs     map[string]*v1.PersistentVolume
	drivers map[string]*storagev1.CSIDriver
}

func (f *fakeObjects) PersistentVolumeClaim(ns, name string) (*v1.PersistentVolumeClaim, bool) {
	o, ok := f.pvcs[ns+"/"+name]
	return o, ok
}

func (f *fakeObjects) PersistentVolume(name string) (*v1.PersistentVolume, bool) {
	o, ok := f.pvs[name]
	return o, ok
}

func (f *fakeObjects) CSIDriver(name string) (*storagev1.CSIDriver, bool) {
	o, ok := f.drivers[name]
	return o, ok
}

func objects(objs ...any) *fakeObjects {
	f := &fakeObjects{pvcs: map[string]*v1.PersistentVolumeClaim{}, pvs: map[string]*v1.PersistentVolume{}, drivers: map[string]*storagev1.CSIDriver{}}
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.PersistentVolumeClaim:
			f.pvcs[o.Namespace+"/"+o.Name] = o
		case *v1.PersistentVolume:
			f.pvs[o.Name] = o
		case *storagev1.CSIDriver:
			f.drivers[o.Name] = o
		}
	}
	return f
}

const (
	driver = "csi.example.com"
	ns     = "ns1"
)

var rwo = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}

func boundPVC(name, pvName string, uid types.UID) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pvName},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
}

func csiPV(name, handle string, claimUID types.UID) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
			AccessModes:            rwo,
			ClaimRef:               &v1.ObjectReference{Namespace: ns, Name: "claim", UID: claimUID},
		},
	}
}

func inTreePV(name string, src v1.PersistentVolumeSource, claimUID types.UID) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: src,
			AccessModes:            rwo,
			ClaimRef:               &v1.ObjectReference{Namespace: ns, Name: "claim", UID: claimUID},
		},
	}
}

func pvcVolume(claim string, readOnly bool) v1.Volume {
	return v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnly}}}
}

func testPod(vols ...v1.Volume) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod1", UID: "pod1-uid"},
		Spec:       v1.PodSpec{NodeName: "node-a", Volumes: vols},
	}
}

func csiDriverObj(attachRequired *bool) *storagev1.CSIDriver {
	return &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}, Spec: storagev1.CSIDriverSpec{AttachRequired: attachRequired}}
}

func TestResolve(t *testing.T) {
	ownedPVC := boundPVC("pod1-scratch", "pv-eph", "eph-uid")
	ownedPVC.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod1", UID: "pod1-uid", Controller: ptr.To(true)}}
	foreignPVC := boundPVC("pod1-scratch", "pv-eph", "eph-uid")
	foreignPVC.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "other", UID: "other-uid", Controller: ptr.To(true)}}
	ephemeralVolume := v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}
	unbound := boundPVC("claim", "", "claim-uid")
	unbound.Status.Phase = v1.ClaimPending
	noClaimRef := csiPV("pv1", "h1", "")
	noClaimRef.Spec.ClaimRef = nil
	emptyHandle := csiPV("pv1", "", "claim-uid")
	ebs := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-0123"}}
	gcePV := inTreePV("pv-gce", v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk1"}}, "claim-uid")
	gcePV.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}

	tests := []struct {
		name     string
		vol      v1.Volume
		objs     *fakeObjects
		migrated map[string]bool
		want     volume.Status
		// wantMsg must be contained in Result.Message.
		wantMsg string
		check   func(t *testing.T, a volume.Attachable)
	}{
		{
			name: "bound PVC with CSI PV, no CSIDriver object → attach required",
			vol:  pvcVolume("claim", true),
			objs: objects(boundPVC("claim", "pv1", "claim-uid"), csiPV("pv1", "h1", "claim-uid")),
			want: volume.StatusAttach,
			check: func(t *testing.T, a volume.Attachable) {
				if a.UniqueName != "kubernetes.io/csi/csi.example.com^h1" || a.Driver != driver || a.VolumeHandle != "h1" ||
					a.PVName != "pv1" || a.SpecName != "pv1" || a.InlineSpec != nil || !a.ReadOnly || a.MigratedFrom != "" || len(a.AccessModes) != 1 {
					t.Errorf("attachable = %+v", a)
				}
			},
		},
		{
			name: "CSIDriver attachRequired=true → attach",
			vol:  pvcVolume("claim", false),
			objs: objects(boundPVC("claim", "pv1", "claim-uid"), csiPV("pv1", "h1", "claim-uid"), csiDriverObj(ptr.To(true))),
			want: volume.StatusAttach,
		},
		{
			name: "CSIDriver without attachRequired → attach",
			vol:  pvcVolume("claim", false),
			objs: objects(boundPVC("claim", "pv1", "claim-uid"), csiPV("pv1", "h1", "claim-uid"), csiDriverObj(nil)),
			want: volume.StatusAttach,
		},
		{
			name:    "CSIDriver attachRequired=false → nothing to attach",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv1", "claim-uid"), csiPV("pv1", "h1", "claim-uid"), csiDriverObj(ptr.To(false))),
			want:    volume.StatusNoAttach,
			wantMsg: "CSIDriver csi.example.com has attachRequired=false",
		},
		{
			name:    "PVC missing → pending, names the PVC",
			vol:     pvcVolume("claim", false),
			objs:    objects(),
			want:    volume.StatusPending,
			wantMsg: "PVC ns1/claim not found",
		},
		{
			name:    "PVC unbound → pending with phase",
			vol:     pvcVolume("claim", false),
			objs:    objects(unbound),
			want:    volume.StatusPending,
			wantMsg: `PVC ns1/claim is not bound (phase "Pending", volumeName "")`,
		},
		{
			name:    "PV missing → pending, names PV and PVC",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv1", "claim-uid")),
			want:    volume.StatusPending,
			wantMsg: "PV pv1 bound to PVC ns1/claim not found",
		},
		{
			name:    "PV without claimRef → pending",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv1", "claim-uid"), noClaimRef),
			want:    volume.StatusPending,
			wantMsg: "PV pv1 is not yet bound to PVC ns1/claim",
		},
		{
			name:    "PV claimRef UID mismatch (PVC re-created) → pending",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv1", "new-uid"), csiPV("pv1", "h1", "old-uid")),
			want:    volume.StatusPending,
			wantMsg: `PV pv1 is bound to another claim: spec.claimRef.uid "old-uid", PVC ns1/claim has uid "new-uid"`,
		},
		{
			name:    "CSI PV with empty handle → invalid",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv1", "claim-uid"), emptyHandle),
			want:    volume.StatusInvalid,
			wantMsg: "PV pv1 has an empty CSI volume handle",
		},
		{
			name: "migrated in-tree AWS EBS PV → ebs.csi.aws.com",
			vol:  pvcVolume("claim", false),
			objs: objects(boundPVC("claim", "pv-ebs", "claim-uid"), inTreePV("pv-ebs", ebs, "claim-uid")),
			want: volume.StatusAttach,
			check: func(t *testing.T, a volume.Attachable) {
				if a.Driver != "ebs.csi.aws.com" || a.VolumeHandle != "vol-0123" || a.PVName != "pv-ebs" ||
					a.MigratedFrom != "kubernetes.io/aws-ebs" || a.UniqueName != "kubernetes.io/csi/ebs.csi.aws.com^vol-0123" {
					t.Errorf("attachable = %+v", a)
				}
			},
		},
		{
			name: "migrated in-tree GCE PD PV → pd.csi.storage.gke.io with zonal handle",
			vol:  pvcVolume("claim", false),
			objs: objects(boundPVC("claim", "pv-gce", "claim-uid"), gcePV),
			want: volume.StatusAttach,
			check: func(t *testing.T, a volume.Attachable) {
				if a.Driver != "pd.csi.storage.gke.io" || a.VolumeHandle != "projects/UNSPECIFIED/zones/us-central1-a/disks/disk1" || a.MigratedFrom != "kubernetes.io/gce-pd" {
					t.Errorf("attachable = %+v", a)
				}
			},
		},
		{
			name:     "in-tree AWS EBS PV with migration off → not a CSI volume",
			vol:      pvcVolume("claim", false),
			objs:     objects(boundPVC("claim", "pv-ebs", "claim-uid"), inTreePV("pv-ebs", ebs, "claim-uid")),
			migrated: map[string]bool{"kubernetes.io/gce-pd": true},
			want:     volume.StatusNoAttach,
			wantMsg:  "PV pv-ebs is neither a CSI volume nor migrated to CSI",
		},
		{
			name:    "migrated driver with attachRequired=false → nothing to attach",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv-ebs", "claim-uid"), inTreePV("pv-ebs", ebs, "claim-uid"), &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "ebs.csi.aws.com"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}}),
			want:    volume.StatusNoAttach,
			wantMsg: "attachRequired=false",
		},
		{
			name:    "NFS PV → not a CSI volume",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv-nfs", "claim-uid"), inTreePV("pv-nfs", v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}}, "claim-uid")),
			want:    volume.StatusNoAttach,
			wantMsg: "neither a CSI volume nor migrated",
		},
		{
			name:    "iSCSI PV → unsupported in-tree attachable plugin",
			vol:     pvcVolume("claim", false),
			objs:    objects(boundPVC("claim", "pv-iscsi", "claim-uid"), inTreePV("pv-iscsi", v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "t", IQN: "iqn"}}, "claim-uid")),
			want:    volume.StatusUnsupported,
			wantMsg: "in-tree attachable plugin",
		},
		{
			name: "inline migrated AWS EBS → translated inline spec",
			vol:  v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0456", ReadOnly: true}}},
			objs: objects(),
			want: volume.StatusAttach,
			check: func(t *testing.T, a volume.Attachable) {
				if a.Driver != "ebs.csi.aws.com" || a.VolumeHandle != "vol-0456" || a.PVName != "" || a.InlineSpec == nil ||
					a.SpecName != "ebs.csi.aws.com-vol-0456" || !a.ReadOnly || a.MigratedFrom != "kubernetes.io/aws-ebs" {
					t.Errorf("attachable = %+v", a)
				}
				src := a.Source()
				if src.PersistentVolumeName != nil || src.InlineVolumeSpec == nil || src.InlineVolumeSpec.CSI.VolumeHandle != "vol-0456" {
					t.Errorf("source = %+v", src)
				}
			},
		},
		{
			name:    "CSI ephemeral inline volume → never attached",
			vol:     v1.Volume{Name: "eph", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: driver}}},
			objs:    objects(),
			want:    volume.StatusNoAttach,
			wantMsg: "CSI ephemeral inline volume",
		},
		{name: "emptyDir → nothing to attach", vol: v1.Volume{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, objs: objects(), want: volume.StatusNoAttach},
		{name: "configMap → nothing to attach", vol: v1.Volume{Name: "c", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}}, objs: objects(), want: volume.StatusNoAttach},
		{name: "secret → nothing to attach", vol: v1.Volume{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "x"}}}, objs: objects(), want: volume.StatusNoAttach},
		{
			name:    "inline FC → unsupported in-tree attachable plugin",
			vol:     v1.Volume{Name: "fc", VolumeSource: v1.VolumeSource{FC: &v1.FCVolumeSource{}}},
			objs:    objects(),
			want:    volume.StatusUnsupported,
			wantMsg: "volume fc uses an in-tree attachable plugin",
		},
		{
			name: "generic ephemeral volume owned by the pod → attach",
			vol:  ephemeralVolume,
			objs: objects(ownedPVC, csiPV("pv-eph", "h-eph", "eph-uid")),
			want: volume.StatusAttach,
		},
		{
			name:    "generic ephemeral volume whose PVC belongs to another pod → invalid",
			vol:     ephemeralVolume,
			objs:    objects(foreignPVC, csiPV("pv-eph", "h-eph", "eph-uid")),
			want:    volume.StatusInvalid,
			wantMsg: "PVC ns1/pod1-scratch was not created for pod ns1/pod1 (pod is not owner)",
		},
		{
			name:    "generic ephemeral volume before its PVC exists → pending",
			vol:     ephemeralVolume,
			objs:    objects(),
			want:    volume.StatusPending,
			wantMsg: "PVC ns1/pod1-scratch not found",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := volume.NewResolver(tc.migrated)
			got := r.Resolve(context.Background(), testPod(tc.vol), &tc.vol, tc.objs)
			if got.Status != tc.want {
				t.Fatalf("status = %v (%q), want %v", got.Status, got.Message, tc.want)
			}
			if got.PodVolume != tc.vol.Name {
				t.Errorf("PodVolume = %q", got.PodVolume)
			}
			if !strings.Contains(got.Message, tc.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", got.Message, tc.wantMsg)
			}
			if tc.want == volume.StatusAttach && got.Message != "" {
				t.Errorf("attachable volume with message %q", got.Message)
			}
			if tc.check != nil {
				tc.check(t, got.Volume)
			}
		})
	}
}

func TestResolvePodDeduplicatesAttachables(t *testing.T) {
	objs := objects(boundPVC("claim", "pv1", "claim-uid"), csiPV("pv1", "h1", "claim-uid"))
	a, b := pvcVolume("claim", false), pvcVolume("claim", true)
	b.Name = "again"
	pod := testPod(a, b, v1.Volume{Name: "e", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
	res := volume.NewResolver(nil).ResolvePod(context.Background(), pod, objs)
	if len(res) != 3 {
		t.Fatalf("results = %d", len(res))
	}
	if got := volume.Attachables(res); len(got) != 1 || got[0].PVName != "pv1" {
		t.Errorf("attachables = %+v", got)
	}
}

func TestPodNeedsVolumes(t *testing.T) {
	now := metav1.Now()
	running := v1.ContainerStatus{State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}
	exited := v1.ContainerStatus{State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}}
	tests := []struct {
		name string
		mod  func(p *v1.Pod)
		want bool
	}{
		{"scheduled running pod", func(p *v1.Pod) { p.Status.Phase = v1.PodRunning }, true},
		{"unscheduled pod", func(p *v1.Pod) { p.Spec.NodeName = "" }, false},
		{"pod without volumes", func(p *v1.Pod) { p.Spec.Volumes = nil }, false},
		{"succeeded pod", func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }, false},
		{"failed pod", func(p *v1.Pod) { p.Status.Phase = v1.PodFailed }, false},
		{"deleting pod with a running container", func(p *v1.Pod) {
			p.DeletionTimestamp = &now
			p.Status.ContainerStatuses = []v1.ContainerStatus{running}
		}, true},
		{"deleting pod whose containers all exited", func(p *v1.Pod) {
			p.DeletionTimestamp = &now
			p.Status.ContainerStatuses = []v1.ContainerStatus{exited}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := testPod(pvcVolume("claim", false))
			tc.mod(p)
			if got := volume.PodNeedsVolumes(p); got != tc.want {
				t.Errorf("PodNeedsVolumes = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFromVolumeAttachment(t *testing.T) {
	r := volume.NewResolver(nil)
	ebs := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0123"}}
	objs := objects(csiPV("pv1", "h1", "u"), inTreePV("pv-ebs", ebs, "u"))
	va := func(src storagev1.VolumeAttachmentSource) *storagev1.VolumeAttachment {
		return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}, Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: "n", Source: src}}
	}
	t.Run("CSI PV", func(t *testing.T) {
		a, err := r.FromVolumeAttachment(context.Background(), va(storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv1")}), objs)
		if err != nil || a.UniqueName != "kubernetes.io/csi/csi.example.com^h1" {
			t.Errorf("got %+v, %v", a, err)
		}
	})
	t.Run("in-tree PV is translated so its key matches the desired state's", func(t *testing.T) {
		a, err := r.FromVolumeAttachment(context.Background(), va(storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-ebs")}), objs)
		if err != nil || a.UniqueName != "kubernetes.io/csi/ebs.csi.aws.com^vol-0123" {
			t.Errorf("got %+v, %v", a, err)
		}
	})
	t.Run("inline spec", func(t *testing.T) {
		spec := &v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h"}}, AccessModes: rwo}
		a, err := r.FromVolumeAttachment(context.Background(), va(storagev1.VolumeAttachmentSource{InlineVolumeSpec: spec}), objs)
		if err != nil || a.UniqueName != "kubernetes.io/csi/d^h" || a.InlineSpec == nil || a.MultiAttachAllowed() {
			t.Errorf("got %+v, %v", a, err)
		}
	})
	t.Run("PV gone", func(t *testing.T) {
		_, err := r.FromVolumeAttachment(context.Background(), va(storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("gone")}), objs)
		if !errors.Is(err, volume.ErrSourcePVNotFound) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("no source", func(t *testing.T) {
		if _, err := r.FromVolumeAttachment(context.Background(), va(storagev1.VolumeAttachmentSource{}), objs); err == nil {
			t.Error("no error")
		}
	})
}

func TestVolumeAttachmentObject(t *testing.T) {
	a := volume.NewAttachable(driver, "h1")
	a.PVName = "pv1"
	va := a.VolumeAttachment("node-a")
	// sha256("h1" + "csi.example.com" + "node-a"), as kube-controller-manager names it.
	if va.Name != a.AttachmentName("node-a") || !strings.HasPrefix(va.Name, "csi-") || len(va.Name) != 4+64 {
		t.Errorf("name = %q", va.Name)
	}
	if va.Spec.Attacher != driver || va.Spec.NodeName != "node-a" || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != "pv1" {
		t.Errorf("spec = %+v", va.Spec)
	}
	name, err := volume.AttachmentNameFor(a.UniqueName, "node-a")
	if err != nil || name != va.Name {
		t.Errorf("AttachmentNameFor = %q, %v", name, err)
	}
}

func TestMultiAttachAllowed(t *testing.T) {
	tests := []struct {
		modes []v1.PersistentVolumeAccessMode
		want  bool
	}{
		{nil, true},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, false},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}, false},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteMany}, true},
		{[]v1.PersistentVolumeAccessMode{v1.ReadOnlyMany}, true},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOnce, v1.ReadOnlyMany}, true},
	}
	for _, tc := range tests {
		if got := volume.MultiAttachAllowed(tc.modes); got != tc.want {
			t.Errorf("MultiAttachAllowed(%v) = %v, want %v", tc.modes, got, tc.want)
		}
	}
}
