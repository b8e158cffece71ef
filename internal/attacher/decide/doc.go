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
// runs them and decides nothing itself: a failure it meets is classified here
// (Reason.Class), and what a publish came to is decided here too
// (attach.go: AfterPublish says what the status write records, VAFate
// what the write's answer and a live read tell of the VolumeAttachment,
// PublishOutcome whether the publication is attached, an orphan, a suspect
// or a failure to retry). The executor hands those answers back as values.
//
// The decision is made in two halves because the second half's facts are
// costly: Attach and Detach decide from the informer caches; only when a
// plan calls the driver does the pass read the controller-publish Secret
// (an API read) and build the CSI VolumeCapability (with the CSI types,
// which this package may not import), and WithCallFacts /
// DetachWithCallFacts mark in the plan the calls BeforeCall forbids,
// before the executor runs it. The plans, and the facts beyond Observed,
// are in plan.go; attach.go holds everything a successful attach's
// decisions call, so that following one VolumeAttachment enters one file
// of this package.
//
// The orphaned-publication decisions (orphan.go) are pure too: which
// VolumeAttachment owns a publication whose own VolumeAttachment is gone,
// when a ListVolumes listing may forget it, which PV it holds, and what a
// live read of a VolumeAttachment says about a publication made for it.
package decide
