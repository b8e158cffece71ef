package decide

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestSingleNode(t *testing.T) {
	cases := []struct {
		modes []v1.PersistentVolumeAccessMode
		want  bool
	}{
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, true},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}, true},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOnce, v1.ReadWriteMany}, false},
		{[]v1.PersistentVolumeAccessMode{v1.ReadOnlyMany}, false},
		{[]v1.PersistentVolumeAccessMode{v1.ReadWriteOnce, v1.ReadOnlyMany}, false},
		{nil, false},
	}
	for _, tc := range cases {
		if got := SingleNode(tc.modes); got != tc.want {
			t.Errorf("SingleNode(%v) = %v, want %v", tc.modes, got, tc.want)
		}
	}
}

func TestPublishBlockedByOrphan(t *testing.T) {
	rwo := Volume{Handle: "vol-1", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}}
	rwx := Volume{Handle: "vol-1", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}}
	onN1 := Orphan{Handle: "vol-1", NodeID: "n1-id", NodeName: "n1", VA: "va-old", UID: "u-old"}
	cases := []struct {
		name    string
		vol     Volume
		nodeID  string
		pending []Orphan
		want    string // substring of the message; "" for not blocked
	}{
		{"single-node volume, orphan on another node ID: blocked", rwo, "n2-id", []Orphan{onN1},
			`volume "vol-1" may be published to one node only (access modes [ReadWriteOnce]) and is still published to node "n1" (node ID "n1-id") for VolumeAttachment "va-old" (uid u-old)`},
		{"single-node volume, orphan on the same node ID: not blocked (the same publication)", rwo, "n1-id", []Orphan{onN1}, ""},
		{"single-node volume, orphan of another handle: not blocked", rwo, "n2-id", []Orphan{{Handle: "vol-2", NodeID: "n1-id"}}, ""},
		{"multi-node volume, orphan published single-node elsewhere: blocked", rwx, "n2-id", []Orphan{func() Orphan { o := onN1; o.SingleNode = true; return o }()}, "ControllerPublish to node ID \"n2-id\" waits"},
		{"multi-node volume, orphan published multi-node elsewhere: not blocked", rwx, "n2-id", []Orphan{onN1}, ""},
		{"suspect on another node: blocked, may still be published", rwo, "n2-id", []Orphan{func() Orphan { o := onN1; o.Suspect = true; return o }()}, "may still be published to node \"n1\""},
		{"record without a node name: named by node ID", rwo, "n2-id", []Orphan{{Handle: "vol-1", NodeID: "n1-id", VA: "va-x", FromRecord: true}}, `still published to node ID "n1-id" for VolumeAttachment "va-x"`},
		{"nothing pending", rwo, "n2-id", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := PublishBlockedByOrphan(tc.vol, tc.nodeID, tc.pending)
			switch {
			case tc.want == "" && b != nil:
				t.Fatalf("blocked: %v", b.Message)
			case tc.want != "" && b == nil:
				t.Fatal("not blocked")
			case b != nil && (b.Reason != ReasonOrphanOnOtherNode || !strings.Contains(b.Message, tc.want)):
				t.Fatalf("blocked %s: %q, want %s containing %q", b.Reason, b.Message, ReasonOrphanOnOtherNode, tc.want)
			}
			if b != nil && b.Reason.Class() != ClassRetry {
				t.Errorf("class %v, want Retry", b.Reason.Class())
			}
		})
	}
}

// Attach holds a publish back while an orphan of its single-node volume
// is on another node ID, and writes nothing before it (no PV finalizer, no
// VA metadata).
func TestAttachWaitsForOrphanOnAnotherNode(t *testing.T) {
	obs := Observed{VA: testVA(), PV: testPV(), CSINode: testCSINode(testDriver),
		Pending: []Orphan{{Handle: "vol-1", NodeID: "node-0-id", VA: "va-gone", UID: "u0"}}}
	p := Attach(obs, drv, nil)
	if p.Blocked == nil || p.Blocked.Reason != ReasonOrphanOnOtherNode || p.Publish || p.Metadata != nil || p.AddPVFinalizer != "" {
		t.Fatalf("plan = %+v, want only blocked by %s", p, ReasonOrphanOnOtherNode)
	}
	obs.Pending[0].NodeID = "node-1-id"
	if p := Attach(obs, drv, nil); p.Blocked != nil || !p.Publish {
		t.Fatalf("orphan on the same node ID: plan = %+v, want a publish", p)
	}
}
