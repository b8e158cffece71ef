// Package attacher is the csi-attacher sidecar: it turns VolumeAttachments
// whose spec.attacher names our driver into ControllerPublishVolume and
// ControllerUnpublishVolume calls.
//
// The package is split the way the project splits every controller: the
// decisions are in package decide (pure: observed objects in, plan out; no
// clients, no gRPC, no clock, no logger), the executor (executor.go)
// carries a plan out against the API server and the driver, and the
// controller owns informers, queues and event filtering and runs the
// passes: observe the caches, decide, hand the plan to the executor.
package attacher
