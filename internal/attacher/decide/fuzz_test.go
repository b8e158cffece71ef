package decide

import (
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
	if bit(17) {
		spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
		if obs.PV != nil {
			obs.PV.Spec.AccessModes = spec.AccessModes
		}
		if va.Spec.Source.InlineVolumeSpec != nil {
			va.Spec.Source.InlineVolumeSpec.AccessModes = spec.AccessModes
		}
	}
	// Publications to undo (orphans, suspects, publishes in flight) of
	// the volume, on another node ID and on this one.
	pending := Orphan{Handle: handle, VA: "va-gone", SingleNode: bit(16), Suspect: bit(18), Publishing: bit(19)}
	if bit(14) {
		o := pending
		o.NodeID = "other-" + nodeID
		obs.Pending = append(obs.Pending, o)
	}
	if bit(15) {
		o := pending
		o.NodeID = nodeID
		obs.Pending = append(obs.Pending, o)
	}
	if bit(20) {
		// Another volume's publication to another node ID.
		o := pending
		o.Handle, o.NodeID, o.VA, o.SingleNode = handle+"-other", "other-"+nodeID, "va-other", true
		obs.Pending = append(obs.Pending, o)
	}
	return obs
}

func addFuzzSeeds(f *testing.F) {
	for _, bits := range []uint32{
		0,
		1<<3 | 1<<5 | 1<<8 | 1<<9, // new VA, everything present
		1<<3 | 1<<5 | 1<<7 | 1<<8 | 1<<9 | 1<<10 | 1<<11 | 1<<12,  // attached and recorded
		1<<3 | 1<<8 | 1<<9 | 1<<10 | 1<<11,                        // PV gone, annotations left
		1<<4 | 1<<8 | 1<<9,                                        // inline
		1<<3 | 1<<4 | 1<<5,                                        // both sources
		1<<0 | 1<<3 | 1<<5 | 1<<8 | 1<<9,                          // PV of another driver
		1<<3 | 1<<5 | 1<<6 | 1<<10,                                // PV deleting
		1<<3 | 1<<5 | 1<<8 | 1<<10 | 1<<13,                        // CSINode without the driver, empty node name
		1<<3 | 1<<5 | 1<<8 | 1<<9 | 1<<14,                         // an orphan of the volume on another node ID
		1<<3 | 1<<5 | 1<<8 | 1<<9 | 1<<14 | 1<<17,                 // the same, ReadWriteMany
		1<<3 | 1<<5 | 1<<8 | 1<<9 | 1<<14 | 1<<16 | 1<<17 | 1<<19, // a single-node publish in flight elsewhere, ReadWriteMany now
		1<<3 | 1<<5 | 1<<8 | 1<<9 | 1<<15,                         // an orphan on this very node ID
		1<<3 | 1<<5 | 1<<8 | 1<<9 | 1<<20,                         // another volume's publication elsewhere
		1<<3 | 1<<5 | 1<<8 | 1<<9 | 1<<14 | 1<<20,                 // both
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
// the publish; a volume that may be on one node only is never published to
// a node ID while a publication of it to another node ID is pending (an
// orphan, a suspect or a publish in flight).
func FuzzAttach(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, bits uint32, pvName, handle, nodeID, annHandle, annNodeID string) {
		obs := fuzzObserved(bits, pvName, handle, nodeID, annHandle, annNodeID)
		va := obs.VA.DeepCopy()
		p := Attach(obs, drv, nil)
		if !equalVA(va, obs.VA) {
			t.Fatalf("DecideAttach modified its input")
		}
		// The attacher hands Attach only the pending publications of
		// PublishHandle's handle: the plan must be the same as with all.
		ofHandle := obs
		ofHandle.Pending = nil
		if h, ok := PublishHandle(obs, drv, nil); ok {
			for _, o := range obs.Pending {
				if o.Handle == h {
					ofHandle.Pending = append(ofHandle.Pending, o)
				}
			}
		}
		if q := Attach(ofHandle, drv, nil); !reflect.DeepEqual(p, q) {
			t.Fatalf("with only the pending publications of the handle PublishHandle names, the plan is %+v; with all of them %+v", q, p)
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
		for _, o := range obs.Pending {
			if o.Handle == p.Volume.Handle && o.NodeID != p.NodeID && (SingleNode(p.Volume.AccessModes) || o.SingleNode) {
				t.Fatalf("plan publishes single-node volume %q to %q while a publication of it to %q is pending: %+v", p.Volume.Handle, p.NodeID, o.NodeID, o)
			}
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

// FuzzSettleOrphan checks what may come of a pending orphan: it is never
// unpublished while a VolumeAttachment with our finalizer claims its
// publication, nor while one will once its finalizer lands; an entry read
// from the record without a node name (or VolumeAttachment, uid) is never
// unpublished; and an entry the driver could list but has not shown is
// never unpublished either.
func FuzzSettleOrphan(f *testing.F) {
	for _, bits := range []uint8{0, 1, 1 | 2, 1 | 4 | 8, 1 | 4 | 8 | 16, 1 | 32, 1 | 64, 32, 64, 1 | 4 | 128} {
		f.Add(bits, "vol-1", "n1-id", "n1", "va-1", "u1")
		f.Add(bits, "vol-1", "n1-id", "", "va-1", "u1")
	}
	f.Fuzz(func(t *testing.T, bits uint8, handle, nodeID, nodeName, va, uid string) {
		bit := func(i int) bool { return bits&(1<<i) != 0 }
		o := Orphan{Handle: handle, NodeID: nodeID, NodeName: nodeName, VA: va, UID: types.UID(uid),
			FromRecord: bit(0), Uncertain: bit(1), SingleNode: bit(7)}
		c := Corroboration{CanList: bit(2), Listed: bit(3) && !bit(4)}
		switch {
		case bit(5):
			c.Claim = Owner
		case bit(6):
			c.Claim = OwnerOnceRecorded
		}
		got := SettleOrphan(o, c)
		if got != OrphanUnpublish {
			return
		}
		switch {
		case c.Claim != NotOwner:
			t.Fatalf("orphan %+v unpublished although a VolumeAttachment claims it (%v)", o, c.Claim)
		case o.FromRecord && (o.NodeName == "" || o.VA == "" || o.UID == "" || o.Handle == "" || o.NodeID == ""):
			t.Fatalf("entry %+v of the record without everything csi-attacher writes is unpublished", o)
		case o.FromRecord && c.CanList && !c.Listed:
			t.Fatalf("entry %+v of the record unpublished before a listing showed it", o)
		}
	})
}
