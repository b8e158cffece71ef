package nodestatus_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/nodestatus"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

var (
	volA = kubenames.UniqueVolumeName("d", "a")
	volB = kubenames.UniqueVolumeName("d", "b")
	volC = kubenames.UniqueVolumeName("d", "c")
)

func att(vol v1.UniqueVolumeName, st state.AttachState, reported bool) state.Attachment {
	return state.Attachment{Key: state.Key{Volume: vol, Node: "n1"}, State: st, ReportedInNodeStatus: reported}
}

func node(avs ...v1.AttachedVolume) *v1.Node {
	return &v1.Node{Status: v1.NodeStatus{VolumesAttached: avs}}
}

func TestForNode(t *testing.T) {
	entries := []state.Attachment{
		att(volC, state.StateAttached, true),
		att(volA, state.StateAttached, true),
		att(volB, state.StateAttaching, false),                                 // not attached yet: kubelet must not mount
		att(kubenames.UniqueVolumeName("d", "x"), state.StateDetaching, false), // detach started: out
	}
	tests := []struct {
		name       string
		node       *v1.Node
		entries    []state.Attachment
		want       []v1.AttachedVolume
		wantUpdate bool
	}{
		{
			name:       "empty status, two attached volumes → sorted list, update",
			node:       node(),
			entries:    entries,
			want:       []v1.AttachedVolume{{Name: volA}, {Name: volC}},
			wantUpdate: true,
		},
		{
			name:    "same set in another order → no write",
			node:    node(v1.AttachedVolume{Name: volC}, v1.AttachedVolume{Name: volA}),
			entries: entries,
			want:    []v1.AttachedVolume{{Name: volA}, {Name: volC}},
		},
		{
			name:       "volume being detached still listed → removed, update",
			node:       node(v1.AttachedVolume{Name: volA}, v1.AttachedVolume{Name: volB}, v1.AttachedVolume{Name: volC}),
			entries:    entries,
			want:       []v1.AttachedVolume{{Name: volA}, {Name: volC}},
			wantUpdate: true,
		},
		{
			name:    "existing device path is kept, no write",
			node:    node(v1.AttachedVolume{Name: volA, DevicePath: "/dev/xvdf"}),
			entries: []state.Attachment{att(volA, state.StateAttached, true)},
			want:    []v1.AttachedVolume{{Name: volA, DevicePath: "/dev/xvdf"}},
		},
		{
			name:       "non-CSI volume left by kube-controller-manager is kept",
			node:       node(v1.AttachedVolume{Name: "kubernetes.io/iscsi/p:iqn:0"}),
			entries:    []state.Attachment{att(volA, state.StateAttached, true)},
			want:       []v1.AttachedVolume{{Name: volA}, {Name: "kubernetes.io/iscsi/p:iqn:0"}},
			wantUpdate: true,
		},
		{
			name:       "duplicate line in the status → cleaned up",
			node:       node(v1.AttachedVolume{Name: volA}, v1.AttachedVolume{Name: volA}),
			entries:    []state.Attachment{att(volA, state.StateAttached, true)},
			want:       []v1.AttachedVolume{{Name: volA}},
			wantUpdate: true,
		},
		{
			name: "nothing attached, nothing listed → no write",
			node: node(),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, update := nodestatus.ForNode(tc.node, tc.entries)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("volumesAttached (-want +got):\n%s", diff)
			}
			if update != tc.wantUpdate {
				t.Errorf("update = %v, want %v", update, tc.wantUpdate)
			}
		})
	}
}

func TestMergePatch(t *testing.T) {
	b, err := nodestatus.MergePatch([]v1.AttachedVolume{{Name: volA}})
	if err != nil || string(b) != `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d^a","devicePath":""}]}}` {
		t.Errorf("patch = %s, %v", b, err)
	}
	b, err = nodestatus.MergePatch(nil)
	if err != nil || string(b) != `{"status":{"volumesAttached":null}}` {
		t.Errorf("empty patch = %s, %v", b, err)
	}
}
