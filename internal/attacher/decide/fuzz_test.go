package decide

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// fuzzObserved builds an observation from fuzzer-chosen switches: every
// combination of source kind, PV presence and state, CSINode state and what
// the VolumeAttachment already carries.
func fuzzObserved(bits uint32, pvName, handle, nodeID, annHandle, annNodeID string) Observed {
	bit := func(i int) bool { return bits&(1<<i) != 0 }
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va", ResourceVersion: "1"},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: "node-1"},
	}
	driver := testDriver
	if bit(0) {
		driver = "other.csi.test"
	}
	spec := v1.PersistentVolumeSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}}
	if !bit(1) {
		spec.CSI = &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}
		if bit(2) {
			spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "s"}
		}
	}
	if bit(3) {
		va.Spec.Source.PersistentVolumeName = &pvName
	}
	if bit(4) {
		va.Spec.Source.InlineVolumeSpec = spec.DeepCopy()
	}
	obs := Observed{VA: va}
	if bit(5) {
		obs.PV = &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName, ResourceVersion: "2"}, Spec: spec}
		if bit(6) {
			now := metav1.Now()
			obs.PV.DeletionTimestamp = &now
		}
		if bit(7) {
			obs.PV.Finalizers = []string{kubenames.PVFinalizer(testDriver)}
		}
	}
	if bit(8) {
		obs.CSINode = &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
		if bit(9) {
			obs.CSINode.Spec.Drivers = []storagev1.CSINodeDriver{{Name: testDriver, NodeID: nodeID}}
		}
	}
	if bit(10) {
		va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
	}
	if bit(11) {
		va.Annotations = map[string]string{AnnVolumeHandle: annHandle, kubenames.VANodeIDAnnotation: annNodeID}
	}
	if bit(12) {
		va.Status.Attached = true
	}
	if bit(13) {
		va.Spec.NodeName = ""
	}
	return obs
}

func addFuzzSeeds(f *testing.F) {
	for _, bits := range []uint32{
		0,
		1<<3 | 1<<5 | 1<<8 | 1<<9, // new VA, everything present
		1<<3 | 1<<5 | 1<<7 | 1<<8 | 1<<9 | 1<<10 | 1<<11 | 1<<12, // attached and recorded
		1<<3 | 1<<8 | 1<<9 | 1<<10 | 1<<11,                       // PV gone, annotations left
		1<<4 | 1<<8 | 1<<9,                                       // inline
		1<<3 | 1<<4 | 1<<5,                                       // both sources
		1<<0 | 1<<3 | 1<<5 | 1<<8 | 1<<9,                         // PV of another driver
		1<<3 | 1<<5 | 1<<6 | 1<<10,                               // PV deleting
		1<<3 | 1<<5 | 1<<8 | 1<<10 | 1<<13,                       // CSINode without the driver, empty node name
	} {
		f.Add(bits, "pv-1", "vol-1", "node-1-id", "vol-1", "node-1-id")
		f.Add(bits, "pv-1", "", "", "", "")
	}
}

// FuzzDecideAttach checks the attach plan's safety properties: a plan that
// reaches ControllerPublish always carries (or first adds) the VA finalizer
// and records the handle and node ID it publishes with, so a later detach
// can always find them; a PV source gets the PV finalizer first; a
// recorded node ID is never overwritten without unpublishing it first; only
// an attached=true latch believes (finalizer and node ID recorded) skips
// the publish.
func FuzzAttach(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, bits uint32, pvName, handle, nodeID, annHandle, annNodeID string) {
		obs := fuzzObserved(bits, pvName, handle, nodeID, annHandle, annNodeID)
		va := obs.VA.DeepCopy()
		p := Attach(obs, drv, nil)
		if !equalVA(va, obs.VA) {
			t.Fatalf("DecideAttach modified its input")
		}
		switch {
		case p.Blocked != nil:
			if p.Done || p.Metadata != nil || p.AddPVFinalizer != "" || p.Blocked.Message == "" || p.Blocked.Reason == "" {
				t.Fatalf("blocked plan carries more than the reason, or no message: %+v", p)
			}
			return
		case p.Done:
			if !va.Status.Attached || !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(testDriver)) || va.Annotations[kubenames.VANodeIDAnnotation] == "" {
				t.Fatalf("Done for a VA that is not attached or lacks the finalizer or node ID (a foreign claim): %+v", va)
			}
			return
		}
		recordedNodeID := va.Annotations[kubenames.VANodeIDAnnotation]
		hadFinalizer := slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(testDriver))
		if p.Metadata != nil && hadFinalizer && recordedNodeID != "" {
			if newID, ok := p.Metadata.SetAnnotations[kubenames.VANodeIDAnnotation]; ok && newID != recordedNodeID &&
				(p.UnpublishFirst == nil || p.UnpublishFirst.NodeID != recordedNodeID) {
				t.Fatalf("plan rewrites the recorded node ID %q to %q without unpublishing it first: %+v", recordedNodeID, newID, p)
			}
		}
		if !p.Publish {
			// Only a believed attachment skips the publish, and it keeps
			// the node ID it was published with.
			if !va.Status.Attached || !hadFinalizer || recordedNodeID == "" || p.UnpublishFirst != nil {
				t.Fatalf("plan without a publish for a VA whose attachment latch does not believe: %+v", p)
			}
			if p.Metadata != nil && p.Metadata.SetAnnotations[kubenames.VANodeIDAnnotation] != "" {
				t.Fatalf("plan rewrites the node ID of an attached VA: %+v", p)
			}
			return
		}
		if p.Volume.Handle == "" || p.NodeID == "" {
			t.Fatalf("publish plan without a handle or node ID: %+v", p)
		}
		finalizer := slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(testDriver))
		annotations := map[string]string{}
		for k, v := range va.Annotations {
			annotations[k] = v
		}
		if p.Metadata != nil {
			finalizer = finalizer || p.Metadata.AddFinalizer == kubenames.AttacherFinalizer(testDriver)
			for k, v := range p.Metadata.SetAnnotations {
				annotations[k] = v
			}
		}
		if !finalizer {
			t.Fatalf("plan publishes without the VA finalizer being present or added first: %+v", p)
		}
		if annotations[AnnVolumeHandle] != p.Volume.Handle || annotations[kubenames.VANodeIDAnnotation] != p.NodeID {
			t.Fatalf("plan publishes %q to %q but the VA will record %q/%q", p.Volume.Handle, p.NodeID, annotations[AnnVolumeHandle], annotations[kubenames.VANodeIDAnnotation])
		}
		if src := va.Spec.Source.PersistentVolumeName; src != nil {
			if !slices.Contains(obs.PV.Finalizers, kubenames.PVFinalizer(testDriver)) && p.AddPVFinalizer != *src {
				t.Fatalf("plan publishes PV %q without its finalizer being present or added first: %+v", *src, p)
			}
			if obs.PV.Spec.CSI.VolumeHandle != p.Volume.Handle || obs.PV.Spec.CSI.Driver != testDriver {
				t.Fatalf("plan publishes handle %q of driver %q; the PV says %+v", p.Volume.Handle, testDriver, obs.PV.Spec.CSI)
			}
		}
	})
}

// FuzzDecideDetach checks that a VA carrying our finalizer is never
// reported Done (the finalizer goes only after a successful unpublish,
// which only a non-blocked plan leads to), and that a plan always names a
// handle and node ID taken from live objects or from what attach recorded.
func FuzzDetach(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, bits uint32, pvName, handle, nodeID, annHandle, annNodeID string) {
		obs := fuzzObserved(bits, pvName, handle, nodeID, annHandle, annNodeID)
		now := metav1.Now()
		obs.VA.DeletionTimestamp = &now
		va := obs.VA.DeepCopy()
		p := Detach(obs, drv, nil)
		if !equalVA(va, obs.VA) {
			t.Fatalf("DecideDetach modified its input")
		}
		has := slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(testDriver))
		switch {
		case !has:
			if !p.Done {
				t.Fatalf("VA without our finalizer: want Done, got %+v", p)
			}
		case p.Done:
			t.Fatalf("VA with our finalizer reported Done: the finalizer would go without an unpublish")
		case p.Blocked != nil:
			if p.Blocked.Message == "" {
				t.Fatalf("blocked without a message: %+v", p)
			}
		default:
			if p.Volume.Handle == "" || p.NodeID == "" {
				t.Fatalf("unpublish plan without a handle or node ID: %+v", p)
			}
			if p.Volume.Handle != va.Annotations[AnnVolumeHandle] && (obs.PV == nil || obs.PV.Spec.CSI == nil || p.Volume.Handle != obs.PV.Spec.CSI.VolumeHandle) &&
				(va.Spec.Source.InlineVolumeSpec == nil || va.Spec.Source.InlineVolumeSpec.CSI == nil || p.Volume.Handle != va.Spec.Source.InlineVolumeSpec.CSI.VolumeHandle) {
				t.Fatalf("unpublish handle %q comes from nowhere", p.Volume.Handle)
			}
			// The recorded node ID, when there is one, is the one the
			// volume was published with: always the one unpublished.
			recorded := va.Annotations[kubenames.VANodeIDAnnotation]
			if live, ok := CSINodeID(obs.CSINode, testDriver); recorded != "" && p.NodeID != recorded || recorded == "" && p.NodeID != live {
				t.Fatalf("unpublish node ID %q; annotation %q, CSINode says %q (%v)", p.NodeID, recorded, live, ok)
			}
		}
	})
}

func equalVA(a, b *storagev1.VolumeAttachment) bool {
	return slices.Equal(a.Finalizers, b.Finalizers) && len(a.Annotations) == len(b.Annotations) && a.Status.Attached == b.Status.Attached
}
