package decide

// GateDetach is the last rule of a detach, applied by the executor after
// it applied p.Actual: a VolumeAttachment is deleted only once the kubelet
// can no longer see its volume as attached. listed says whether the
// node's status.volumesAttached may still list the volume (the last
// successful write, a write in flight, or, before the first write of this
// process, the informer's Node), read atomically with applying p.Actual,
// so that a node status write computed before the apply is counted.
//
// A detach that finds the volume listed becomes KindWaitForNodeStatus: no
// delete and no events; the node status updater is woken (WakeNodeStatus)
// and, once it wrote the list without the volume, wakes the key again.
// Any other plan, or a volume no longer listed, is returned unchanged.
func GateDetach(p Plan, listed bool) Plan {
	if p.Kind != KindDetach || !listed {
		return p
	}
	g := p
	g.Kind = KindWaitForNodeStatus
	g.Why = "waiting for the node status to drop the volume before detaching"
	g.Detach = nil
	g.Events = nil
	g.RequeueAfter = 0
	g.WakeNodeStatus = true
	return g
}
