package decide

// NodeListing is what the key's Node says about the key's volume: the
// facts behind the correction of an assumed mount (see Input.Listing).
type NodeListing struct {
	// InUse: the Node's status.volumesInUse lists the volume.
	InUse bool
	// Attached: the informer's Node lists the volume in
	// status.volumesAttached.
	Attached bool
	// Written: the controller's last successful write of the Node's
	// status.volumesAttached, or a write in flight, lists the volume.
	Written bool
}

// listed reports whether the kubelet may have seen the volume as attached
// (or reports it in use).
func (l NodeListing) listed() bool { return l.InUse || l.Attached || l.Written }

// correctAssumedMount drops the "assume mounted" of an actual state entry
// the kubelet cannot have mounted. The actual state assumes every new
// entry mounted until the node's next volumesInUse change, because the
// informer may lag behind the kubelet. In an event-driven controller that
// change may never come (a Pod deleted while its volume was still
// attaching, a dangling VolumeAttachment found at start), and the volume
// would stay attached until the node goes NotReady. A kubelet mounts only
// volumes listed in its node's status.volumesAttached; a volume that was
// never reported there, is not wanted, and that the Node lists neither in
// volumesAttached (informer, last or in-flight write) nor in volumesInUse
// is not mounted.
//
// A nil in.Listing (the Node does not exist, or the caller did not look)
// keeps the assumption. The returned Input shares everything with in but
// the Actual entry, which is copied when corrected.
func correctAssumedMount(in Input) Input {
	a := in.Actual
	if a == nil || !a.MountedByNode || a.ReportedInNodeStatus || in.Wanted != nil || in.Listing == nil || in.Listing.listed() {
		return in
	}
	corrected := *a
	corrected.MountedByNode = false
	in.Actual = &corrected
	return in
}
