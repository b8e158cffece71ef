// Package stack assembles the whole attach/detach path for tests, bench and
// latch-local: the in-process control plane (internal/localcluster), the
// kubelet stand-in with its nodes, the mock CSI driver, csi-attacher
// (in-process replicas, child processes of the real binary, trivial mode,
// or none) and the attach/detach controller, each started through the
// entry point its binary uses and with its binary's defaults
// (attacher.DefaultSidecarConfig, controller.DefaultServeConfig) unless
// the caller adjusts them.
//
// The pieces start on their own too (Attacher, Controller, MockDriver),
// for rigs that assemble a world step by step. Production binaries never
// link this package (test/boundaries).
package stack
