package kubelet_test

import (
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// The ordering contract between the attach/detach controller, the
// attacher and the kubelet is checked by kubeletorder (shared with
// test/e2e/attachdetach). Every test of the package checks every attach
// it makes with checkAttach and every detach with checkDetach, so the
// contract is asserted on every volume that leaves a node.

// attachFacts are the attach's landmarks, for a test's own checks.
type attachFacts struct {
	publish, stage, nodePublish csimock.Call
	attached, running           change
}

// checkAttach is kubeletorder's CheckAttach for vol on n and the Pod pod
// running it: ControllerPublish ends before the kubelet's first NodeStage
// of the volume on that node starts, NodeStage ends before NodePublish
// starts, and the Pod is Running only after the VolumeAttachment was
// attached (by RV).
func (r *rig) checkAttach(vol string, n *node, pod string) attachFacts {
	r.t.Helper()
	f := r.order().CheckAttach(r.t, vol, n.Name, n.id, pod)
	return attachFacts{publish: f.Publish, stage: f.Stage, nodePublish: f.NodePublish, attached: f.Attached, running: f.Running}
}

// detachFacts are the detach's landmarks.
type detachFacts struct {
	unpublish, unstage, ctrlUnpublish csimock.Call
	lastInUse, deleting, gone         change
}

// checkDetach is kubeletorder's CheckDetach for vol leaving n after an
// unmount: NodeUnpublish → NodeUnstage → the volume leaves volumesInUse →
// the VolumeAttachment is deleted → ControllerUnpublish → the
// VolumeAttachment is removed, and the node holds the volume no more.
func (r *rig) checkDetach(vol string, n *node) detachFacts {
	r.t.Helper()
	f := r.order().CheckDetach(r.t, vol, n.Name, n.id)
	return detachFacts{unpublish: f.Unpublish, unstage: f.Unstage, ctrlUnpublish: f.CtrlUnpublish, lastInUse: f.LastInUse, deleting: f.Deleting, gone: f.Gone}
}

func (r *rig) order() *kubeletorder.Checker {
	return &kubeletorder.Checker{Driver: r.s.Driver, DriverName: testDriver, History: r.hist.History}
}
