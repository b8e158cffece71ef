package state

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

const listedVol = v1.UniqueVolumeName("kubernetes.io/csi/d^h")

func avList(names ...v1.UniqueVolumeName) []v1.AttachedVolume {
	var out []v1.AttachedVolume
	for _, n := range names {
		out = append(out, v1.AttachedVolume{Name: n})
	}
	return out
}

// reportOn sets whether the entry of listedVol on node "n" is reported in
// node status (it is created attached).
func reportOn(a *Actual, reported bool) {
	a.Apply(Key{Volume: listedVol, Node: "n"}, Update{State: StateAttached, ReportedInNodeStatus: reported})
}

// writeList plays one node status pass of node "n": take the entries,
// then finish the write of the list they make (ok: the write succeeded)
// at rv.
func writeList(a *Actual, ok bool, rv string) {
	var list []v1.AttachedVolume
	for _, e := range a.BeginNodeStatusWrite("n") {
		if e.ReportedInNodeStatus {
			list = append(list, v1.AttachedVolume{Name: e.Volume})
		}
	}
	a.FinishNodeStatusWrite("n", list, ok, rv)
}

func TestNodeLists_detachWaitsForAWriteComputedBeforeIt(t *testing.T) {
	a := NewActual()
	reportOn(a, true)
	// The node status worker takes the entries (volume still reported)
	// and starts writing.
	a.BeginNodeStatusWrite("n")
	// The detach stops reporting the volume meanwhile: the write in
	// flight still carries it, so the detach must wait.
	reportOn(a, false)
	if !a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("detach may delete the VolumeAttachment while a write listing the volume is in flight")
	}
	a.FinishNodeStatusWrite("n", avList(listedVol), true, "1")
	if !a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("the last write lists the volume; detach must wait")
	}
	// The next pass writes the list without the volume.
	writeList(a, true, "1")
	if a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("the volume is off the list; detach must go ahead")
	}
}

func TestNodeLists_failedWriteKeepsTheLastSuccessfulList(t *testing.T) {
	a := NewActual()
	reportOn(a, true)
	writeList(a, true, "1")
	reportOn(a, false)
	writeList(a, false, "1") // the write failed: the server still lists the volume
	if !a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("a failed write must not count as having removed the volume")
	}
}

func TestNodeLists_beforeAnyWriteTheInformerDecides(t *testing.T) {
	a := NewActual()
	if !a.NodeStatusMayList("n", listedVol, avList(listedVol)) {
		t.Fatal("the informer lists the volume and nothing was written yet")
	}
	if a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("the informer does not list the volume")
	}
}

func TestNodeLists_deletedNodeListsNothing(t *testing.T) {
	a := NewActual()
	reportOn(a, true)
	writeList(a, true, "1")
	a.NodeStatusGone("n")
	if a.NodeStatusMayList("n", listedVol, avList(listedVol)) {
		t.Fatal("a deleted node has no status to wait for")
	}
	a.NodeStatusSeen("n") // re-created with an empty status
	if a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("a re-created node starts with nothing written")
	}
}

func TestNodeLists_deletedNodeForgottenOnceEmpty(t *testing.T) {
	a := NewActual()
	reportOn(a, true)
	writeList(a, true, "1")
	a.NodeStatusGone("n")
	a.ForgetNodeStatus("n")
	if len(a.lists.gone) == 0 {
		t.Fatal("a node with an entry left was forgotten")
	}
	a.Apply(Key{Volume: listedVol, Node: "n"}, Update{Remove: true})
	a.ForgetNodeStatus("n")
	if len(a.lists.gone) != 0 || len(a.lists.written) != 0 || len(a.lists.inflight) != 0 {
		t.Fatalf("actual state still holds the deleted node: gone %v written %v inflight %v", a.lists.gone, a.lists.written, a.lists.inflight)
	}
	if a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("a forgotten node lists nothing when the informer has no node")
	}
}

func TestNodeLists_forgetNodeKeepsAWriteInFlight(t *testing.T) {
	a := NewActual()
	reportOn(a, true)
	a.BeginNodeStatusWrite("n")
	a.Apply(Key{Volume: listedVol, Node: "n"}, Update{Remove: true})
	a.ForgetNodeStatus("n")
	if !a.NodeStatusMayList("n", listedVol, nil) {
		t.Fatal("a write in flight still lists the volume")
	}
}

func TestNodeLists_informerBehindUntilItShowsOurLastWrite(t *testing.T) {
	a := NewActual()
	if a.NodeStatusInformerBehind("n", "5") {
		t.Fatal("nothing written: the informer is the truth")
	}
	reportOn(a, true)
	writeList(a, true, "10")
	reportOn(a, false)
	writeList(a, true, "12")
	for rv, behind := range map[string]bool{"9": true, "10": true, "11": true, "12": false, "13": false, "not-a-number": false} {
		if got := a.NodeStatusInformerBehind("n", rv); got != behind {
			t.Errorf("informer at %s after writes up to 12: behind = %v, want %v", rv, got, behind)
		}
	}
	a.NodeStatusGone("n")
	if a.NodeStatusInformerBehind("n", "9") {
		t.Error("a deleted node has no write to wait for")
	}
}
