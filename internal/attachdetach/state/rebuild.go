package state

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Rebuilding the actual state at start, in upstream's order: first every
// Node's status (what it was told is attached and what it uses), then
// every VolumeAttachment; a VA that the node statuses do not explain is
// uncertain, so it gets detached if nothing wants it and confirmed if
// something does.

// AddFromNode records node.status.volumesAttached as attached and
// reported, and node.status.volumesInUse as mounted. Names that are not
// CSI unique names (in-tree plugins latch does not handle) are skipped and
// returned as errors wrapping kubenames.ErrInvalidUniqueVolumeName. Returns the
// keys added or changed.
func (a *Actual) AddFromNode(node *v1.Node) ([]Key, error) {
	var errs []error
	var keys []Key
	a.mu.Lock()
	for _, av := range node.Status.VolumesAttached {
		if _, _, err := kubenames.ParseUniqueVolumeName(string(av.Name)); err != nil {
			errs = append(errs, fmt.Errorf("node %s status.volumesAttached: %w", node.Name, err))
			continue
		}
		key := Key{Volume: av.Name, Node: node.Name}
		e, ok := a.entries[key]
		if !ok {
			e = &Attachment{Key: key}
			a.insertLocked(e)
		}
		if e.State == StateAttached && e.ReportedInNodeStatus {
			continue
		}
		e.State = StateAttached
		e.ReportedInNodeStatus = true
		keys = append(keys, key)
	}
	a.mu.Unlock()
	keys = append(keys, a.SetVolumesInUse(node.Name, node.Status.VolumesInUse)...)
	return dedupKeys(keys), errors.Join(errs...)
}

// AddUncertain records that a VolumeAttachment of vol exists on node. An
// entry that already exists keeps its state and only learns the spec when
// it had none; a new one is uncertain. Returns whether anything changed.
func (a *Actual) AddUncertain(vol volume.Attachable, node string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := Key{Volume: vol.UniqueName, Node: node}
	if e, ok := a.entries[key]; ok {
		if e.Spec != nil {
			return false
		}
		e.Spec = &vol
		return true
	}
	a.insertLocked(&Attachment{Key: key, Spec: &vol, State: StateUncertain})
	a.assumeMountedLocked(key)
	return true
}

// AddFromVolumeAttachments records every VA as AddUncertain does, after
// the node statuses were added. VAs of PVs that no longer exist cannot be
// keyed (their volume handle is unknown) and come back as errors wrapping
// volume.ErrSourcePVNotFound. Returns the keys added or changed.
func (a *Actual) AddFromVolumeAttachments(ctx context.Context, vas []*storagev1.VolumeAttachment, r *volume.Resolver, objs volume.Objects) ([]Key, error) {
	var errs []error
	var keys []Key
	for _, va := range vas {
		vol, err := r.FromVolumeAttachment(ctx, va, objs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if a.AddUncertain(vol, va.Spec.NodeName) {
			keys = append(keys, Key{Volume: vol.UniqueName, Node: va.Spec.NodeName})
		}
	}
	return dedupKeys(keys), errors.Join(errs...)
}
