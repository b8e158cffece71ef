package nodestatus

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

const vol = v1.UniqueVolumeName("kubernetes.io/csi/d^h")

func list(names ...v1.UniqueVolumeName) []v1.AttachedVolume {
	var out []v1.AttachedVolume
	for _, n := range names {
		out = append(out, v1.AttachedVolume{Name: n})
	}
	return out
}

func noInformer() []v1.AttachedVolume { return nil }

// write plays one node status pass of node "n": snapshot vols, then
// finish the write of that list (ok: the write succeeded) at rv.
func write(b *Book, ok bool, rv string, vols ...v1.UniqueVolumeName) {
	b.Snapshot("n", func() []v1.AttachedVolume { return list(vols...) })
	b.Finish("n", list(vols...), ok, rv)
}

func TestStatusBook_detachWaitsForAWriteComputedBeforeIt(t *testing.T) {
	b := NewBook()
	// The node status worker snapshots the actual state (volume still
	// reported) and starts writing.
	b.Snapshot("n", func() []v1.AttachedVolume { return list(vol) })
	// The detach removes the volume from the actual state meanwhile: the
	// write in flight still carries it, so the detach must wait.
	if !b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("detach may delete the VolumeAttachment while a write listing the volume is in flight")
	}
	b.Finish("n", list(vol), true, "1")
	if !b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("the last write lists the volume; detach must wait")
	}
	// The next pass writes the list without the volume.
	write(b, true, "1")
	if b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("the volume is off the list; detach must go ahead")
	}
}

func TestStatusBook_failedWriteKeepsTheLastSuccessfulList(t *testing.T) {
	b := NewBook()
	write(b, true, "1", vol)
	write(b, false, "1") // the write failed: the server still lists vol
	if !b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("a failed write must not count as having removed the volume")
	}
}

func TestStatusBook_beforeAnyWriteTheInformerDecides(t *testing.T) {
	b := NewBook()
	if !b.ApplyAndCheck("n", vol, func() {}, func() []v1.AttachedVolume { return list(vol) }) {
		t.Fatal("the informer lists the volume and nothing was written yet")
	}
	if b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("the informer does not list the volume")
	}
}

func TestStatusBook_deletedNodeListsNothing(t *testing.T) {
	b := NewBook()
	write(b, true, "1", vol)
	b.NodeGone("n")
	if b.ApplyAndCheck("n", vol, func() {}, func() []v1.AttachedVolume { return list(vol) }) {
		t.Fatal("a deleted node has no status to wait for")
	}
	b.NodeSeen("n") // re-created with an empty status
	if b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("a re-created node starts with nothing written")
	}
}

func TestStatusBook_applyRunsUnderTheLock(t *testing.T) {
	b := NewBook()
	ran := false
	b.ApplyAndCheck("n", vol, func() { ran = true }, noInformer)
	if !ran {
		t.Fatal("apply not called")
	}
}

func TestStatusBook_deletedNodeForgottenOnceEmpty(t *testing.T) {
	b := NewBook()
	write(b, true, "1", vol)
	b.NodeGone("n")
	b.ForgetNode("n")
	if len(b.gone) != 0 || len(b.written) != 0 || len(b.inflight) != 0 {
		t.Fatalf("book still holds the deleted node: gone %v written %v inflight %v", b.gone, b.written, b.inflight)
	}
	if b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("a forgotten node lists nothing when the informer has no node")
	}
}

func TestStatusBook_forgetNodeKeepsAWriteInFlight(t *testing.T) {
	b := NewBook()
	b.Snapshot("n", func() []v1.AttachedVolume { return list(vol) })
	b.ForgetNode("n")
	if !b.ApplyAndCheck("n", vol, func() {}, noInformer) {
		t.Fatal("a write in flight still lists the volume")
	}
}

func TestStatusBook_informerBehindUntilItShowsOurLastWrite(t *testing.T) {
	b := NewBook()
	if b.InformerBehind("n", "5") {
		t.Fatal("nothing written: the informer is the truth")
	}
	write(b, true, "10", vol)
	write(b, true, "12")
	for rv, behind := range map[string]bool{"9": true, "10": true, "11": true, "12": false, "13": false, "not-a-number": false} {
		if got := b.InformerBehind("n", rv); got != behind {
			t.Errorf("informer at %s after writes up to 12: behind = %v, want %v", rv, got, behind)
		}
	}
	b.NodeGone("n")
	if b.InformerBehind("n", "9") {
		t.Error("a deleted node has no write to wait for")
	}
}
