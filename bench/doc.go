// Package bench measures latch on a local control plane (embedded etcd and
// an in-process kube-apiserver) with the mock CSI driver: how fast bursts of
// VolumeAttachments attach and detach, what that costs the API server, the
// csi-attacher and the attachdetach-controller, and how close the attach
// rate gets to what the same API server can absorb at all.
//
// The scenarios (A–F) are described in docs/performance.md. Run them with
// `make bench` (cmd/latch-bench); the package's tests run the small scale
// and check only correctness figures (publishes, writes per attach, every
// volume attached and detached), never timings.
//
// The peers comparison (peers*.go, `make bench-peers`,
// cmd/latch-bench-peers) runs latch's components beside the upstream
// external-attacher and kube-controller-manager and latch's previous
// release on one control plane, in interleaved rounds, per storage-backend
// profile of the mock driver; see docs/performance.md, "Against upstream".
package bench
