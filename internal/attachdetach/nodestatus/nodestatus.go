// Package nodestatus computes the Node.status.volumesAttached list that
// the actual state of the world implies, so the node status updater can
// batch per node and never write a no-op.
//
// The kubelet of a controller-managed node mounts a volume only once it is
// listed in status.volumesAttached, so the list must contain exactly the
// volumes the controller confirmed attached and has not started to detach.
package nodestatus

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// VolumesAttached returns the status.volumesAttached the node should have,
// sorted by name: the entries with ReportedInNodeStatus, plus the current
// entries that are not CSI volumes (left over by kube-controller-manager
// for in-tree plugins latch does not handle; they are not ours to drop).
// A device path already in the status is kept (the CSI plugin reports
// none, but an older writer may have), so keeping a volume never rewrites
// its line.
func VolumesAttached(current []v1.AttachedVolume, entries []state.Attachment) []v1.AttachedVolume {
	devicePath := make(map[v1.UniqueVolumeName]string, len(current))
	var out []v1.AttachedVolume
	for _, av := range current {
		devicePath[av.Name] = av.DevicePath
		if _, _, err := kubenames.ParseUniqueVolumeName(string(av.Name)); err != nil {
			out = append(out, av)
		}
	}
	for _, e := range entries {
		if e.ReportedInNodeStatus {
			out = append(out, v1.AttachedVolume{Name: e.Volume, DevicePath: devicePath[e.Volume]})
		}
	}
	slices.SortFunc(out, func(a, b v1.AttachedVolume) int { return cmp.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b v1.AttachedVolume) bool { return a.Name == b.Name })
}

// NeedsUpdate reports whether node's status.volumesAttached differs from
// want. Order does not matter (the API server and the kubelet treat the
// list as a set); duplicates in the current status count as a difference
// so they get cleaned up.
func NeedsUpdate(node *v1.Node, want []v1.AttachedVolume) bool {
	cur := slices.Clone(node.Status.VolumesAttached)
	if len(cur) != len(want) {
		return true
	}
	slices.SortFunc(cur, func(a, b v1.AttachedVolume) int { return cmp.Compare(a.Name, b.Name) })
	sorted := slices.Clone(want)
	slices.SortFunc(sorted, func(a, b v1.AttachedVolume) int { return cmp.Compare(a.Name, b.Name) })
	return !slices.Equal(cur, sorted)
}

// ForNode is VolumesAttached for node and the ASW entries on it, and
// whether the node needs a write.
func ForNode(node *v1.Node, entries []state.Attachment) ([]v1.AttachedVolume, bool) {
	want := VolumesAttached(node.Status.VolumesAttached, entries)
	return want, NeedsUpdate(node, want)
}

// MergePatch returns the JSON merge patch (types.MergePatchType, status
// subresource) that sets status.volumesAttached to want. A list in a merge
// patch replaces the whole list, and volumesAttached has no strategic
// merge key either, so this is the only shape that works; it leaves every
// other status field (the kubelet's volumesInUse, conditions) alone. An
// empty want clears the field with an explicit null.
func MergePatch(want []v1.AttachedVolume) ([]byte, error) {
	var list any
	if len(want) > 0 {
		list = want
	}
	b, err := json.Marshal(map[string]any{"status": map[string]any{"volumesAttached": list}})
	if err != nil {
		return nil, fmt.Errorf("build node status patch: %w", err)
	}
	return b, nil
}
