package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// fullPod is a Pod as the API server returns it: containers, labels,
// annotations, managed fields, a service-account token volume and config
// volumes beside the ones that may be attached.
func fullPod(mutate func(*v1.Pod)) *v1.Pod {
	now := metav1.NewTime(time.Date(2026, 11, 26, 6, 0, 0, 0, time.UTC))
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "app", Namespace: testNS, UID: "app-uid", ResourceVersion: "42", CreationTimestamp: now,
			Labels: map[string]string{"app": "db"}, Annotations: map[string]string{"note": "big"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "StatefulSet", Name: "db"}},
		},
		Spec: v1.PodSpec{
			NodeName:   "node-a",
			Containers: []v1.Container{{Name: "db", Image: "db:1", Command: []string{"run"}, Env: []v1.EnvVar{{Name: "A", Value: "B"}}}},
			Volumes: []v1.Volume{
				{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
				{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}},
				{Name: "inline", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: testDriver}}},
				{Name: "pd", VolumeSource: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "pd-1"}}},
				{Name: "token", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{}}},
				{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}},
				{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}},
				{Name: "tmp", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
				{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{}}},
				{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/x"}}},
				{Name: "img", VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{Reference: "r"}}},
			},
		},
		Status: v1.PodStatus{
			Phase: v1.PodRunning,
			Conditions: []v1.PodCondition{
				{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(time.Second))},
				{Type: v1.PodReady, Status: v1.ConditionTrue, Message: "ready"},
			},
			InitContainerStatuses: []v1.ContainerStatus{{Name: "init", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}},
			ContainerStatuses:     []v1.ContainerStatus{{Name: "db", Image: "db:1", State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}}},
			PodIPs:                []v1.PodIP{{IP: "10.0.0.1"}},
		},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

// Every fact the controller reads of a Pod is the same on its record, in
// every state a Pod's volumes depend on; what no decision reads is not in
// the record at all; trimming a record changes nothing.
func TestTrimPod_keepsEveryFactTheControllerReads(t *testing.T) {
	deleted := metav1.NewTime(time.Date(2026, 11, 26, 6, 5, 0, 0, time.UTC))
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
	}{
		{"running", fullPod(nil)},
		{"pending, not scheduled", fullPod(func(p *v1.Pod) { p.Spec.NodeName, p.Status.Phase, p.Status.Conditions = "", v1.PodPending, nil })},
		{"succeeded", fullPod(func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded })},
		{"failed", fullPod(func(p *v1.Pod) { p.Status.Phase = v1.PodFailed })},
		{"deleting, container still running", fullPod(func(p *v1.Pod) { p.DeletionTimestamp = &deleted })},
		{"deleting, every container terminated", fullPod(func(p *v1.Pod) {
			p.DeletionTimestamp = &deleted
			p.Status.ContainerStatuses[0].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 137}}
		})},
		{"deleting, container waiting", fullPod(func(p *v1.Pod) {
			p.DeletionTimestamp = &deleted
			p.Status.ContainerStatuses[0].State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
		})},
		{"deleting, init container running", fullPod(func(p *v1.Pod) {
			p.DeletionTimestamp = &deleted
			p.Status.InitContainerStatuses[0].State = v1.ContainerState{Running: &v1.ContainerStateRunning{}}
			p.Status.ContainerStatuses[0].State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{}}
		})},
		{"deleting, ephemeral container running", fullPod(func(p *v1.Pod) {
			p.DeletionTimestamp = &deleted
			p.Status.ContainerStatuses[0].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}
			p.Status.EphemeralContainerStatuses = []v1.ContainerStatus{{Name: "debug", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}
		})},
		{"only config volumes", fullPod(func(p *v1.Pod) { p.Spec.Volumes = p.Spec.Volumes[4:] })},
		{"no status yet", fullPod(func(p *v1.Pod) { p.Status = v1.PodStatus{} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := tc.pod.DeepCopy()
			obj, err := TrimPod(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			got := obj.(*cachedPod)
			if !reflect.DeepEqual(tc.pod, orig) {
				t.Fatal("TrimPod changed the object it was given")
			}
			// A Pod whose volumes no CSI driver attaches needs none of them
			// kept (it has none left); whole, it resolves to nothing to
			// attach: the desired state ends the same.
			wantNeeds := volume.PodNeedsVolumes(orig) && tc.name != "only config volumes"
			if got.needsVolumes() != wantNeeds || got.terminated != volume.PodTerminated(orig) {
				t.Errorf("needsVolumes/terminated = %v/%v, want %v/%v", got.needsVolumes(), got.terminated, wantNeeds, volume.PodTerminated(orig))
			}
			if !got.scheduled.Equal(scheduledAt(orig)) {
				t.Errorf("scheduled = %v, %v whole", got.scheduled, scheduledAt(orig))
			}
			if got.name != orig.Name || got.namespace != orig.Namespace || got.uid != orig.UID || got.resourceVersion != orig.ResourceVersion ||
				got.nodeName != orig.Spec.NodeName {
				t.Errorf("identity or placement changed: %+v", got)
			}
			if ref := got.ref(); ref.Namespace != orig.Namespace || ref.Name != orig.Name || ref.UID != orig.UID {
				t.Errorf("ref = %+v", ref)
			}
			var kept []v1.Volume
			for _, v := range orig.Spec.Volumes {
				switch v.Name {
				case "data", "scratch", "inline", "pd":
					kept = append(kept, v)
				}
			}
			if !reflect.DeepEqual(got.volumes, kept) {
				t.Errorf("volumes kept = %+v, want the ones that may be attachable, whole: %+v", got.volumes, kept)
			}
			// The resolver reads the Pod back: identity, node, the kept volumes.
			back := got.asPod()
			if back.Namespace != orig.Namespace || back.Name != orig.Name || back.UID != orig.UID || back.Spec.NodeName != orig.Spec.NodeName ||
				!reflect.DeepEqual(back.Spec.Volumes, kept) {
				t.Errorf("asPod = %+v", back)
			}
			if again, _ := TrimPod(got); again != any(got) {
				t.Errorf("a record was trimmed again into a new object: %+v", again)
			}
		})
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "team-a/app", Obj: trimmedPod(t, fullPod(nil))}
	if got, _ := TrimPod(tomb); !reflect.DeepEqual(got, tomb) {
		t.Errorf("a tombstone was changed: %+v", got)
	}
}

// A claim keeps its identity, its volume name, its phase and its owners
// (a generic ephemeral volume's claim must be controlled by its Pod).
func TestTrimPVC_keepsBindingAndOwners(t *testing.T) {
	_, pvc := boundClaim("disk-1", v1.ReadWriteOnce)
	pvc.ResourceVersion = "7"
	pvc.Labels = map[string]string{"a": "b"}
	pvc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kcm"}}
	ctrl := true
	pvc.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: "app", UID: "app-uid", Controller: &ctrl}}
	orig := pvc.DeepCopy()
	obj, err := trimPVC(pvc)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*v1.PersistentVolumeClaim)
	want := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: orig.Name, Namespace: orig.Namespace, UID: orig.UID, ResourceVersion: "7", OwnerReferences: orig.OwnerReferences},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: orig.Spec.VolumeName},
		Status:     v1.PersistentVolumeClaimStatus{Phase: orig.Status.Phase},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("trimPVC = %+v, want %+v", got, want)
	}
	if !reflect.DeepEqual(pvc, orig) {
		t.Error("trimPVC changed the object it was given")
	}
	if again, _ := trimPVC(got); again != any(got) {
		t.Errorf("a trimmed claim was trimmed again into a new object: %+v", again)
	}
	if !metav1.IsControlledBy(got, &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "app-uid"}}) {
		t.Error("the trimmed claim lost its controller reference")
	}
}

// A VolumeAttachment keeps every fact decisions read (decide.VAFactsOf),
// its identity and its whole spec; what csi-attacher writes for itself
// (annotations, finalizers, attachment metadata) is gone.
func TestTrimVA_keepsFactsAndSpec(t *testing.T) {
	pvName := "disk-1"
	deleted := metav1.NewTime(time.Date(2026, 11, 26, 7, 0, 0, 0, time.UTC))
	for _, va := range []*storagev1.VolumeAttachment{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "csi-1", UID: "va-uid", ResourceVersion: "9",
				Annotations: map[string]string{"csi.alpha.kubernetes.io/node-id": "node-a-id"},
				Finalizers:  []string{"external-attacher/" + testDriver}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "csi-attacher"}}},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: "node-a", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
			Status: storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdb"},
				DetachError: &storagev1.VolumeError{Message: "busy"}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "csi-2", UID: "va-uid-2", DeletionTimestamp: &deleted},
			Spec:       storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: "node-b", Source: storagev1.VolumeAttachmentSource{InlineVolumeSpec: &v1.PersistentVolumeSpec{}}},
			Status:     storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "denied"}},
		},
	} {
		orig := va.DeepCopy()
		obj, err := trimVA(va)
		if err != nil {
			t.Fatal(err)
		}
		got := obj.(*storagev1.VolumeAttachment)
		if !reflect.DeepEqual(va, orig) {
			t.Fatal("trimVA changed the object it was given")
		}
		if !reflect.DeepEqual(decide.VAFactsOf(got), decide.VAFactsOf(orig)) || !reflect.DeepEqual(got.Spec, orig.Spec) ||
			got.Name != orig.Name || got.UID != orig.UID || got.ResourceVersion != orig.ResourceVersion {
			t.Errorf("trimmed %s = %+v, want the facts, identity and spec of %+v", orig.Name, got, orig)
		}
		if got.Annotations != nil || got.Finalizers != nil || got.ManagedFields != nil || got.Status.AttachmentMetadata != nil {
			t.Errorf("trimmed %s keeps what nothing reads: %+v", orig.Name, got)
		}
	}
}

// A Node keeps what decisions and the node status updater read
// (decide.NodeFactsOf, volumesAttached, volumesInUse); its images,
// addresses, capacity and the other conditions are gone.
func TestTrimNode_keepsFactsAndVolumeLists(t *testing.T) {
	node := managedNode("node-a")
	node.ResourceVersion = "11"
	node.Labels = map[string]string{"zone": "a"}
	node.Annotations["other"] = "x"
	node.Spec.Taints = []v1.Taint{{Key: "node.kubernetes.io/out-of-service", Effect: v1.TaintEffectNoExecute}}
	node.Status.Conditions = append(node.Status.Conditions, v1.NodeCondition{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse})
	node.Status.Images = []v1.ContainerImage{{Names: []string{"registry.example/app:1"}, SizeBytes: 1 << 20}}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}}
	node.Status.VolumesAttached = []v1.AttachedVolume{{Name: uniqueName("disk-1")}}
	node.Status.VolumesInUse = []v1.UniqueVolumeName{uniqueName("disk-1")}
	orig := node.DeepCopy()
	obj, err := trimNode(node)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*v1.Node)
	if !reflect.DeepEqual(node, orig) {
		t.Fatal("trimNode changed the object it was given")
	}
	if decide.NodeFactsOf(got) != decide.NodeFactsOf(orig) || !reflect.DeepEqual(got.Status.VolumesAttached, orig.Status.VolumesAttached) ||
		!reflect.DeepEqual(got.Status.VolumesInUse, orig.Status.VolumesInUse) || got.Name != orig.Name || got.ResourceVersion != "11" {
		t.Errorf("trimmed node = %+v, want the facts and volume lists of %+v", got, orig)
	}
	if got.Labels != nil || len(got.Annotations) != 1 || got.Status.Images != nil || got.Status.Addresses != nil || len(got.Status.Conditions) != 1 {
		t.Errorf("trimmed node keeps what nothing reads: %+v", got)
	}
	unmanaged := managedNode("node-b")
	delete(unmanaged.Annotations, kubenames.ControllerManagedAttachAnnotation)
	if obj, _ := trimNode(unmanaged); decide.NodeFactsOf(obj.(*v1.Node)).Managed {
		t.Error("an unmanaged node became managed when trimmed")
	}
}

// pvObjects is the volume.Objects of one claim and its PV, for resolving a
// Pod volume against a whole or a trimmed PV.
type pvObjects struct {
	pvc *v1.PersistentVolumeClaim
	pv  *v1.PersistentVolume
}

func (w pvObjects) PersistentVolumeClaim(ns, name string) (*v1.PersistentVolumeClaim, bool) {
	return w.pvc, w.pvc != nil && w.pvc.Namespace == ns && w.pvc.Name == name
}

func (w pvObjects) PersistentVolume(name string) (*v1.PersistentVolume, bool) {
	return w.pv, w.pv != nil && w.pv.Name == name
}

func (pvObjects) CSIDriver(string) (*storagev1.CSIDriver, bool) { return nil, false }

// fullPV is a PV as the API server returns it, bound to claim "data":
// labels, annotations (kubectl's last-applied copy), finalizers, managed
// fields, capacity, node affinity, storage class, mount options and
// status around the source mutate sets.
func fullPV(mutate func(*v1.PersistentVolume)) *v1.PersistentVolume {
	pv, _ := boundClaim("data", v1.ReadWriteOnce)
	pv.Name = "pv-data"
	pv.ResourceVersion = "17"
	pv.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 26, 6, 0, 0, 0, time.UTC))
	pv.Labels = map[string]string{"team": "a"}
	pv.Annotations = map[string]string{
		"pv.kubernetes.io/provisioned-by":                  testDriver,
		"kubectl.kubernetes.io/last-applied-configuration": `{"kind":"PersistentVolume"}`,
	}
	pv.Finalizers = []string{"kubernetes.io/pv-protection", "external-attacher/" + testDriver}
	pv.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "csi-provisioner"}}
	pv.Spec.ClaimRef.APIVersion, pv.Spec.ClaimRef.ResourceVersion = "v1", "5"
	pv.Spec.CSI.FSType, pv.Spec.CSI.ReadOnly = "ext4", true
	pv.Spec.CSI.VolumeAttributes = map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1764136800000-8081-" + testDriver}
	pv.Spec.CSI.NodePublishSecretRef = &v1.SecretReference{Name: "publish", Namespace: testNS}
	pv.Spec.StorageClassName = "fast"
	pv.Spec.MountOptions = []string{"noatime"}
	pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{"zone-a"}}},
	}}}}
	pv.Status.LastPhaseTransitionTime = &pv.CreationTimestamp
	if mutate != nil {
		mutate(pv)
	}
	return pv
}

// inTree replaces a PV's CSI source with an in-tree one.
func inTree(src v1.PersistentVolumeSource) func(*v1.PersistentVolume) {
	return func(pv *v1.PersistentVolume) { pv.Spec.PersistentVolumeSource = src }
}

// A PV resolves, trimmed, to the same volume as whole: the same result for
// the Pod volume that claims it (the Attachable every decision reads: its
// unique name, driver, handle, access modes, in-tree plugin), the same
// volume for a VolumeAttachment that names it (the rebuild at start), the
// same driver index and the same claim to wake. An in-tree PV of a plugin
// csi-translation-lib translates stays whole and translates to the same CSI
// source; a CSI PV keeps nothing the controller does not read. Trimming a
// trimmed PV gives an equal PV.
func TestTrimPV_resolvesAsTheWholePV(t *testing.T) {
	ctx := context.Background()
	tr := csitrans.New()
	for _, tc := range []struct {
		name string
		pv   *v1.PersistentVolume
		// migratable: csi-translation-lib translates the source; the PV
		// must stay whole.
		migratable bool
		status     volume.Status
	}{
		{name: "CSI, ReadWriteOnce", pv: fullPV(nil), status: volume.StatusAttach},
		{name: "CSI, ReadWriteMany", pv: fullPV(func(pv *v1.PersistentVolume) {
			pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany, v1.ReadOnlyMany}
		}), status: volume.StatusAttach},
		{name: "CSI, no access modes", pv: fullPV(func(pv *v1.PersistentVolume) { pv.Spec.AccessModes = nil }), status: volume.StatusAttach},
		{name: "CSI, bound to another claim", pv: fullPV(func(pv *v1.PersistentVolume) { pv.Spec.ClaimRef.UID = "other-uid" }), status: volume.StatusPending},
		{name: "CSI, not bound", pv: fullPV(func(pv *v1.PersistentVolume) { pv.Spec.ClaimRef = nil }), status: volume.StatusPending},
		{name: "CSI, empty handle", pv: fullPV(func(pv *v1.PersistentVolume) { pv.Spec.CSI.VolumeHandle = "" }), status: volume.StatusInvalid},
		{name: "GCE PD, zone from a label", pv: fullPV(func(pv *v1.PersistentVolume) {
			inTree(v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "pd-1", FSType: "ext4"}})(pv)
			pv.Labels[v1.LabelTopologyZone] = "europe-west1-b"
			pv.Spec.NodeAffinity = nil
		}), migratable: true, status: volume.StatusAttach},
		{name: "AWS EBS, zone in the node affinity", pv: fullPV(inTree(v1.PersistentVolumeSource{
			AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://eu-west-1a/vol-1"},
		})), migratable: true, status: volume.StatusAttach},
		{name: "Azure File, resource group in an annotation", pv: fullPV(func(pv *v1.PersistentVolume) {
			inTree(v1.PersistentVolumeSource{AzureFile: &v1.AzureFilePersistentVolumeSource{SecretName: "azure-secret", ShareName: "share"}})(pv)
			pv.Annotations["resourceGroup"] = "rg-1"
			pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
		}), migratable: true, status: volume.StatusAttach},
		{name: "NFS", pv: fullPV(inTree(v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs", Path: "/x"}})), status: volume.StatusNoAttach},
		{name: "iSCSI", pv: fullPV(inTree(v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "t", IQN: "i"}})), status: volume.StatusUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pvc := boundClaim("data", v1.ReadWriteOnce)
			pvc.Spec.VolumeName = tc.pv.Name
			whole := tc.pv.DeepCopy()
			obj, err := trimPV(tc.pv)
			if err != nil {
				t.Fatal(err)
			}
			got := obj.(*v1.PersistentVolume)

			resolver := volume.NewResolver(nil)
			pod := podUsing("app", "node-a", pvc.Name)
			wantRes := resolver.Resolve(ctx, pod, &pod.Spec.Volumes[0], pvObjects{pvc, whole})
			if wantRes.Status != tc.status {
				t.Fatalf("the whole PV resolves to %v (%s), the case wants %v", wantRes.Status, wantRes.Message, tc.status)
			}
			if res := resolver.Resolve(ctx, pod, &pod.Spec.Volumes[0], pvObjects{pvc, got}); !reflect.DeepEqual(res, wantRes) {
				t.Errorf("trimmed, the Pod volume resolves to\n%+v\nwhole to\n%+v", res, wantRes)
			}
			va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-1"},
				Spec: storagev1.VolumeAttachmentSpec{Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &whole.Name}}}
			wantA, wantErr := resolver.FromVolumeAttachment(ctx, va, pvObjects{pv: whole})
			gotA, gotErr := resolver.FromVolumeAttachment(ctx, va, pvObjects{pv: got})
			if !reflect.DeepEqual(gotA, wantA) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Errorf("trimmed, the VolumeAttachment's volume is %+v, %v; whole %+v, %v", gotA, gotErr, wantA, wantErr)
			}
			if d, wantD := must(pvDriver(tr, got)), must(pvDriver(tr, whole)); !reflect.DeepEqual(d, wantD) {
				t.Errorf("driver index %v trimmed, %v whole", d, wantD)
			}
			if !reflect.DeepEqual(got.Spec.ClaimRef == nil, whole.Spec.ClaimRef == nil) ||
				(got.Spec.ClaimRef != nil && (got.Spec.ClaimRef.Namespace != whole.Spec.ClaimRef.Namespace || got.Spec.ClaimRef.Name != whole.Spec.ClaimRef.Name)) {
				t.Errorf("claim reference %+v trimmed, %+v whole", got.Spec.ClaimRef, whole.Spec.ClaimRef)
			}
			if got.Name != whole.Name || got.UID != whole.UID || got.ResourceVersion != whole.ResourceVersion {
				t.Errorf("identity changed: %+v", got.ObjectMeta)
			}

			if tc.migratable {
				want, err := tr.TranslateInTreePVToCSI(klog.Background(), whole)
				if err != nil {
					t.Fatal(err)
				}
				translated, err := tr.TranslateInTreePVToCSI(klog.Background(), got)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(translated.Spec, want.Spec) {
					t.Errorf("trimmed, the in-tree PV translates to\n%+v\nwhole to\n%+v", translated.Spec, want.Spec)
				}
				whole.ManagedFields = nil
				if !reflect.DeepEqual(got, whole) {
					t.Errorf("a migratable in-tree PV lost more than its managed fields: %+v", got)
				}
			} else {
				if !reflect.DeepEqual(tc.pv, whole) {
					t.Fatal("trimPV changed the object it was given")
				}
				if got.Labels != nil || got.Annotations != nil || got.Finalizers != nil || got.ManagedFields != nil ||
					got.Spec.Capacity != nil || got.Spec.NodeAffinity != nil || got.Spec.StorageClassName != "" ||
					got.Spec.MountOptions != nil || !reflect.DeepEqual(got.Status, v1.PersistentVolumeStatus{}) ||
					(got.Spec.CSI != nil && !reflect.DeepEqual(*got.Spec.CSI, v1.CSIPersistentVolumeSource{Driver: whole.Spec.CSI.Driver, VolumeHandle: whole.Spec.CSI.VolumeHandle})) {
					t.Errorf("trimmed PV keeps what nothing reads: %+v", got)
				}
			}
			if again, _ := trimPV(got.DeepCopy()); !reflect.DeepEqual(again, got) {
				t.Errorf("trimming a trimmed PV changed it:\n%+v\n%+v", again, got)
			}
		})
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "pv-data", Obj: fullPV(nil)}
	if got, _ := trimPV(tomb); !reflect.DeepEqual(got, tomb) {
		t.Errorf("a tombstone was changed: %+v", got)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The controller's PV informer caches the trimmed PV, and a Pod whose
// claim is bound to it gets its VolumeAttachment.
func TestTrimPV_isThePVInformersTransform(t *testing.T) {
	pv := fullPV(nil)
	_, pvc := boundClaim("data", v1.ReadWriteOnce)
	pvc.Spec.VolumeName = pv.Name
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "data"))
	name := upstreamVAName("data", testDriver, "node-a")
	if got := w.waitWrites(1); !slices.Equal(got, []string{"create volumeattachments " + name}) {
		t.Fatalf("controller writes = %q, want the VolumeAttachment %s created", got, name)
	}
	obj, ok, err := w.c.pvs.GetStore().GetByKey(pv.Name)
	if err != nil || !ok {
		t.Fatalf("PV %s not cached: %v", pv.Name, err)
	}
	cached := obj.(*v1.PersistentVolume)
	if cached.Labels != nil || cached.Annotations != nil || cached.Spec.Capacity != nil || cached.Spec.CSI.VolumeAttributes != nil {
		t.Errorf("the PV informer caches the PV untrimmed: %+v", cached)
	}
}
