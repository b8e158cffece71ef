package kube

import (
	"testing"

	storagev1 "k8s.io/api/storage/v1"
)

// One pass writes twice (metadata 10 → 11, then status 11 → 12): the watch
// delivering the intermediate 11 is our own write too and must not wake a
// worker. A terminal failure recorded by the status write would otherwise
// be retried at once (a second ControllerPublish for an oversized publish
// context). Another client's version is still not ours.
func TestOwnWrites_intermediateVersionOfOurChainIsOwn(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	w.Record("10", vaAt("11", false))
	w.Record("11", vaAt("12", false))
	if !w.IsOwn(vaAt("11", false)) {
		t.Fatalf("isOwn(11): the first write of our chain not recognised")
	}
	if w.IsOwn(vaAt("10", false)) {
		t.Fatalf("isOwn(10): the version we read (another client's) counted as ours")
	}
	// The intermediate event leaves the entry: the cache is still behind
	// our last write.
	if got := resolve(w, vaAt("11", false)); got.ResourceVersion != "12" {
		t.Fatalf("cache at 11 resolved to %s, want our last write 12", got.ResourceVersion)
	}
	if !w.IsOwn(vaAt("12", false)) {
		t.Fatalf("isOwn(12): our last write not recognised")
	}
}
