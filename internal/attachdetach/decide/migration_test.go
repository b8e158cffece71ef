package decide_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

const gcePD = "kubernetes.io/gce-pd"

// gceVolume is rwo translated from an in-tree GCE PD PV.
func gceVolume() volume.Attachable {
	v := rwo
	v.MigratedFrom = gcePD
	return v
}

func TestCSINodeFacts_Migrated(t *testing.T) {
	tests := []struct {
		name  string
		facts decide.CSINodeFacts
		want  bool
	}{
		{"no CSINode", decide.CSINodeFacts{}, false},
		{"no annotation", decide.CSINodeFacts{Exists: true}, false},
		{"only the plugin", decide.CSINodeFacts{Exists: true, MigratedPlugins: gcePD}, true},
		{"plugin among others", decide.CSINodeFacts{Exists: true, MigratedPlugins: "kubernetes.io/aws-ebs," + gcePD + ",kubernetes.io/cinder"}, true},
		{"other plugins only", decide.CSINodeFacts{Exists: true, MigratedPlugins: "kubernetes.io/aws-ebs,kubernetes.io/cinder"}, false},
		{"a prefix of the name is not the name", decide.CSINodeFacts{Exists: true, MigratedPlugins: "kubernetes.io/gce"}, false},
		{"spaces are not trimmed (as upstream)", decide.CSINodeFacts{Exists: true, MigratedPlugins: "kubernetes.io/aws-ebs, " + gcePD}, false},
		{"annotation value without CSINode is ignored", decide.CSINodeFacts{MigratedPlugins: gcePD}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.facts.Migrated(gcePD); got != tc.want {
				t.Errorf("Migrated(%q) on %+v = %v, want %v", gcePD, tc.facts, got, tc.want)
			}
		})
	}
}

func TestCSINodeFactsOf(t *testing.T) {
	if got := decide.CSINodeFactsOf(nil); got != (decide.CSINodeFacts{}) {
		t.Errorf("CSINodeFactsOf(nil) = %+v, want absent", got)
	}
	cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: nodeA,
		Annotations: map[string]string{v1.MigratedPluginsAnnotationKey: gcePD, "other": "x"}}}
	if got, want := decide.CSINodeFactsOf(cn), (decide.CSINodeFacts{Exists: true, MigratedPlugins: gcePD}); got != want {
		t.Errorf("CSINodeFactsOf = %+v, want %+v", got, want)
	}
}

func TestDecide_migrationByNode(t *testing.T) {
	gce := gceVolume()
	gated := decide.DefaultConfig()
	gated.MigrationByNode = map[string]bool{gcePD: true}
	otherGated := decide.DefaultConfig()
	otherGated.MigrationByNode = map[string]bool{"kubernetes.io/aws-ebs": true}
	noCSINode := decide.CSINodeFacts{}
	unlisted := decide.CSINodeFacts{Exists: true, MigratedPlugins: "kubernetes.io/aws-ebs"}
	listed := decide.CSINodeFacts{Exists: true, MigratedPlugins: "kubernetes.io/aws-ebs," + gcePD}
	key := keyOn(nodeA).String()
	msgNoCSINode := `AttachVolume.Attach failed for volume "pv1" : in-tree plugin kubernetes.io/gce-pd is not migrated to CSI on node node-a: ` +
		`node node-a has no CSINode, so nothing lists the plugin in the annotation storage.alpha.kubernetes.io/migrated-plugins; waiting for the node to migrate it`
	msgUnlisted := `AttachVolume.Attach failed for volume "pv1" : in-tree plugin kubernetes.io/gce-pd is not migrated to CSI on node node-a: ` +
		`CSINode node-a does not list the plugin in its annotation storage.alpha.kubernetes.io/migrated-plugins; waiting for the node to migrate it`
	warn := func(pod state.PodRef, msg, cond string) decide.Event {
		return event(pod, v1.EventTypeWarning, "FailedAttachVolume", msg, "not-migrated/"+key+"/"+cond)
	}

	// Key defaults to keyOn(nodeA), Now to t0.
	tests := []planCase{
		{
			name: "gate off (default): migrated volume on a node without CSINode → created at once",
			in:   decide.Input{Wanted: wants(gce, podA), Node: ready, CSINode: noCSINode, Config: decide.DefaultConfig()},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &gce), Create: gce.VolumeAttachment(nodeA)},
		},
		{
			name: "gate on for another plugin: GCE PD volume → created at once",
			in:   decide.Input{Wanted: wants(gce, podA), Node: ready, CSINode: noCSINode, Config: otherGated},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &gce), Create: gce.VolumeAttachment(nodeA)},
		},
		{
			name: "gate on: native CSI volume is not gated → created",
			in:   decide.Input{Wanted: wants(rwo, podA), Node: ready, CSINode: noCSINode, Config: gated},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &rwo), Create: rwo.VolumeAttachment(nodeA)},
		},
		{
			name: "gate on, node has no CSINode → no VolumeAttachment, Warning per pod naming the missing CSINode",
			in:   decide.Input{Wanted: wants(gce, podA, podB), Node: ready, CSINode: noCSINode, Config: gated},
			want: decide.Plan{Kind: decide.KindNodeNotMigrated, Events: []decide.Event{
				warn(podA, msgNoCSINode, "no-csinode"), warn(podB, msgNoCSINode, "no-csinode"),
			}},
		},
		{
			name: "gate on, CSINode without the annotation → wait, Warning naming the annotation",
			in:   decide.Input{Wanted: wants(gce, podA), Node: ready, CSINode: decide.CSINodeFacts{Exists: true}, Config: gated},
			want: decide.Plan{Kind: decide.KindNodeNotMigrated, Events: []decide.Event{warn(podA, msgUnlisted, "not-listed")}},
		},
		{
			name: "gate on, annotation lists other plugins only → wait",
			in:   decide.Input{Wanted: wants(gce, podA), Node: ready, CSINode: unlisted, Config: gated},
			want: decide.Plan{Kind: decide.KindNodeNotMigrated, Events: []decide.Event{warn(podA, msgUnlisted, "not-listed")}},
		},
		{
			name: "gate on, annotation lists the plugin → created",
			in:   decide.Input{Wanted: wants(gce, podA), Node: ready, CSINode: listed, Config: gated},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &gce), Create: gce.VolumeAttachment(nodeA)},
		},
		{
			name: "gate on, not migrated, attached VolumeAttachment → kept and confirmed (no detach)",
			in:   decide.Input{Wanted: wants(gce, podA), Actual: entry(state.StateAttached, true, true), Node: ready, CSINode: unlisted, Config: gated, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindNothing},
		},
		{
			name: "gate on, not migrated, VolumeAttachment created before the node stopped listing the plugin → marked attached",
			in:   decide.Input{Wanted: wants(gce, podA), Actual: entry(state.StateAttaching, false, true), Node: ready, CSINode: noCSINode, Config: gated, VA: vaAttached},
			want: attachedOnA(),
		},
		{
			name: "gate on, not migrated, pending VolumeAttachment → left to the attacher",
			in:   decide.Input{Wanted: wants(gce, podA), Actual: entry(state.StateAttaching, false, true), Node: ready, CSINode: unlisted, Config: gated, VA: vaPending},
			want: decide.Plan{Kind: decide.KindWait, AttachWaiting: true, RequeueAfter: decide.AttachTimeout},
		},
		{
			name: "gate on, not migrated, wanted again while waiting for unmount → detach timer cleared, still attached",
			in:   decide.Input{Wanted: wants(gce, podB), Actual: requested(entry(state.StateAttached, true, true), t0.Add(-time.Minute)), Node: ready, CSINode: unlisted, Config: gated, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindMarkAttached, Actual: upd(state.StateAttached, true, time.Time{}, nil)},
		},
		{
			name: "gate on, not migrated, no pod wants the volume any more → detached as usual",
			in:   decide.Input{Actual: entry(state.StateAttached, true, false), Node: ready, CSINode: unlisted, Config: gated, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "gate on, not migrated, node not controller-managed → nothing, no event",
			in:   decide.Input{Wanted: wants(gce, podA), Node: decide.NodeFacts{Exists: true, Ready: true}, CSINode: noCSINode, Config: gated},
			want: decide.Plan{Kind: decide.KindNothing},
		},
		{
			name: "gate on, not migrated, exclusive volume attached elsewhere → the Multi-Attach conflict is reported, not the migration",
			in: decide.Input{Wanted: wants(gce, podA), Node: ready, CSINode: noCSINode, Config: gated,
				Peers: []decide.Peer{{Node: nodeB, State: state.StateAttached, Pods: []state.PodRef{podB}}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podA, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-1`, "multi-attach/"+key),
			}},
		},
		{
			name: "gate on, not migrated, stale entry without VolumeAttachment → entry kept as it is, detach timer cleared",
			in:   decide.Input{Wanted: wants(gce, podA), Actual: requested(entry(state.StateAttaching, false, true), t0.Add(-time.Minute)), Node: ready, CSINode: unlisted, Config: gated},
			want: decide.Plan{Kind: decide.KindNodeNotMigrated, Actual: upd(state.StateAttaching, false, time.Time{}, nil),
				Events: []decide.Event{warn(podA, msgUnlisted, "not-listed")}},
		},
	}
	checkPlans(t, tests, func(in *decide.Input) {
		if in.Key == (state.Key{}) {
			in.Key = keyOn(nodeA)
		}
		if in.Config.MaxWaitForUnmount == 0 {
			in.Config.MaxWaitForUnmount = decide.DefaultMaxWaitForUnmount
		}
		if in.Now.IsZero() {
			in.Now = t0
		}
	})
}
