// Package decide is csi-attacher's decision half: observed facts in (a
// VolumeAttachment, its PersistentVolume or placeholder, the CSINode entry,
// the driver's capabilities, trivial mode and, once a plan calls the
// driver, the controller-publish secret's presence and whether the CSI
// capability could be built), an ordered plan out. It is shaped like
// internal/attachdetach/decide and kept pure the same way: no clientset, no
// gRPC, no clock, no logger (test/boundaries checks the imports).
//
// The steps of an attach plan run in this order: PV finalizer, unpublish
// of a publication recorded under an older node ID, VA finalizer and
// annotations, ControllerPublish, status. The executor in package attacher
// runs them; a failure it meets is classified here too (Reason.Class).
//
// The decision is made in two halves because the second half's facts are
// costly: Attach and Detach decide from the informer caches; BeforeCall,
// only when a plan is about to call the driver, from the Secret (an API
// read) and the CSI VolumeCapability (built by the executor with the CSI
// types, which this package may not import).
//
// The orphaned-publication decisions (orphan.go) are pure too: which
// VolumeAttachment owns a publication whose own VolumeAttachment is gone,
// when a ListVolumes listing may forget it, which PV it holds, and what a
// live read of a VolumeAttachment says about a publication made for it.
package decide
