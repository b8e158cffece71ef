// Package kube holds the names, constants and API helpers that the
// csi-attacher sidecar and the attach/detach controller must agree on with
// each other and with the upstream components they replace
// (kubernetes-csi/external-attacher and kube-controller-manager).
//
// Everything here is pure: no clients, no clocks, no global state. Names are
// part of the compatibility contract: a latch csi-attacher must be able to
// take over VolumeAttachments, finalizers and Leases written by upstream and
// the other way round, so every rule is pinned by table and fuzz tests.
package kube
