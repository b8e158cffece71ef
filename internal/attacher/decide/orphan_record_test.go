package decide

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestSettleOrphan(t *testing.T) {
	witnessed := Orphan{Handle: "vol-1", NodeID: "n1-id", NodeName: "n1", VA: "va", UID: "u"}
	entry := witnessed
	entry.FromRecord = true
	noNode := entry
	noNode.NodeName = ""
	noUID := entry
	noUID.UID = ""
	cases := []struct {
		name string
		o    Orphan
		c    Corroboration
		want OrphanAction
	}{
		{"witnessed, unclaimed: unpublish", witnessed, Corroboration{}, OrphanUnpublish},
		{"witnessed, unclaimed, driver lists but has not shown it: unpublish (it saw the publish)", witnessed, Corroboration{CanList: true}, OrphanUnpublish},
		{"witnessed, claimed: taken over", witnessed, Corroboration{Claim: Owner}, OrphanTakenOver},
		{"witnessed, owner once its finalizer lands: wait", witnessed, Corroboration{Claim: OwnerOnceRecorded}, OrphanWaitForOwner},
		{"entry without a node name: ignored, even unclaimed", noNode, Corroboration{}, OrphanIgnored},
		{"entry without a node name, listed by the driver: ignored", noNode, Corroboration{CanList: true, Listed: true}, OrphanIgnored},
		{"entry without a node name, claimed: ignored (never unpublished)", noNode, Corroboration{Claim: Owner}, OrphanIgnored},
		{"entry without a uid: ignored", noUID, Corroboration{}, OrphanIgnored},
		{"entry claimed by a VolumeAttachment with our finalizer: taken over, never unpublished", entry, Corroboration{Claim: Owner, CanList: true, Listed: true}, OrphanTakenOver},
		{"entry a VolumeAttachment will claim: wait", entry, Corroboration{Claim: OwnerOnceRecorded, CanList: true, Listed: true}, OrphanWaitForOwner},
		{"entry, driver lists, not shown yet: wait for a listing", entry, Corroboration{CanList: true}, OrphanWaitForListing},
		{"entry, driver lists and shows it, unclaimed: unpublish", entry, Corroboration{CanList: true, Listed: true}, OrphanUnpublish},
		{"entry, driver cannot list, unclaimed: unpublish (the API server corroborates)", entry, Corroboration{}, OrphanUnpublish},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := SettleOrphan(tc.o, tc.c); got != tc.want {
				t.Fatalf("SettleOrphan = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRecordedOrphanSecret(t *testing.T) {
	withSecret := testPV(func(pv *v1.PersistentVolume) {
		pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "pv-secret"}
	})
	entry := Orphan{Handle: "vol-1", NodeID: "n1-id", PV: "pv-1", FromRecord: true}
	cases := []struct {
		name string
		o    Orphan
		pv   *v1.PersistentVolume
		want *v1.SecretReference
	}{
		{"the PV's secret", entry, withSecret, &v1.SecretReference{Namespace: "ns", Name: "pv-secret"}},
		{"PV without a secret: none", entry, testPV(), nil},
		{"PV gone: none", entry, nil, nil},
		{"PV of another volume handle: none", func() Orphan { o := entry; o.Handle = "vol-2"; return o }(), withSecret, nil},
		{"PV of another driver: none", entry, testPV(func(pv *v1.PersistentVolume) {
			pv.Spec.CSI.Driver = "other.csi.test"
			pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "s"}
		}), nil},
		{"entry names no PV: none", func() Orphan { o := entry; o.PV = ""; return o }(), withSecret, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := RecordedOrphanSecret(tc.o, tc.pv, drv, nil)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("RecordedOrphanSecret = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestForgetUnlistedRecordedEntry(t *testing.T) {
	entry := Orphan{Handle: "vol-1", NodeID: "n1-id", Uncertain: true, FromRecord: true}
	if !ForgetUnlisted(entry, false) {
		t.Errorf("an uncertain entry of the record that a listing does not show: want forgotten (it is never unpublished unlisted)")
	}
	if ForgetUnlisted(entry, true) {
		t.Errorf("a listed entry: want kept")
	}
}
