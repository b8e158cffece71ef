package attacher

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/csi"
)

// An old leader's write of the record lands after this attacher read it
// at start (its ControllerPublish returned after it lost the Lease): the
// attacher sees the new entry through its watch of the ConfigMap, unpublishes
// the publication the entry names and removes the entry, without a
// restart.
func TestOrphanRecordWrittenAfterStartIsSeenAndUnpublished(t *testing.T) {
	f := newExecFixture(t, execCSINode())
	const ns = "latch-system"
	f.ctrl.cfg.OrphanNamespace = ns
	f.ctrl.exec.records = newConfigMapOrphanStore(f.client, ns, execDriver)
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-late", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	// The record as this attacher reads it at start: one entry, of a
	// publication that is gone already.
	early, _ := json.Marshal(orphanRecord{UID: "u-early", VolumeHandle: "handle-early", NodeID: "node-1-id", NodeName: "node-1"})
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: OrphanRecordName(execDriver)}, Data: map[string]string{"va-early": string(early)}}
	if cm, err = f.client.CoreV1().ConfigMaps(ns).Create(f.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer f.run()()
	f.waitFor("the early entry settled", func() bool {
		return slices.Contains(f.csiCalls(), "ControllerUnpublishVolume handle-early node-1-id OK") && len(f.ctrl.orphanSnapshot()) == 0
	})

	// The old leader's late write.
	cur, err := f.client.CoreV1().ConfigMaps(ns).Get(f.ctx, OrphanRecordName(execDriver), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	late, _ := json.Marshal(orphanRecord{UID: "u-late", VolumeHandle: "handle-late", NodeID: "node-1-id", NodeName: "node-1"})
	cur = cur.DeepCopy()
	if cur.Data == nil {
		cur.Data = map[string]string{}
	}
	cur.Data["va-late"] = string(late)
	if _, err := f.client.CoreV1().ConfigMaps(ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the late entry's publication unpublished and the entry removed", func() bool {
		got, err := f.client.CoreV1().ConfigMaps(ns).Get(f.ctx, OrphanRecordName(execDriver), metav1.GetOptions{})
		_, recorded := got.Data["va-late"]
		return err == nil && !recorded && len(f.driver.Published("handle-late")) == 0
	})
	if n := slices.Index(f.csiCalls(), "ControllerUnpublishVolume handle-late node-1-id OK"); n < 0 {
		t.Errorf("CSI calls %q: want the late entry unpublished", f.csiCalls())
	}
}

// run runs the controller (its queues, the record's load and watch) until
// the returned func stops it.
func (f *execFixture) run() func() {
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.ctrl.Run(ctx) }()
	return func() {
		stop()
		if err := <-done; err != nil {
			f.t.Errorf("Run: %v", err)
		}
	}
}
