// Package csi is csi-attacher's client of a CSI driver's Identity and
// Controller services: connecting to the driver's unix socket, probing,
// discovering capabilities, ControllerPublish/Unpublish, paging through
// ListVolumes, building the VolumeCapability that goes with a
// PersistentVolume, and classifying errors into "final" and "the operation
// may still be in progress".
//
// Every call is logged at verbosity 4 with secrets stripped by
// csi-lib-utils' protosanitizer; secrets never reach a log line, whatever
// the verbosity.
package csi
