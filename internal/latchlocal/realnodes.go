package latchlocal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/stack"
)

// With Options.RealNodes, what latch-local runs of Kubernetes is the real
// code wherever one machine allows it: kube-scheduler and
// kube-controller-manager (every controller but attachdetach: the PV
// binder, StatefulSet, garbage collector, namespace, service-account and
// root-CA publisher, ...) as child processes, and one hollow kubelet per
// node (the real kubelet of v1.37.2 with a fake container runtime and a
// fake mounter) next to the mock driver's node plugin for that node. The
// kubelet stand-in does not run.

// NodeReadyTimeout bounds the wait for a hollow node to be Ready with the
// mock driver registered in its CSINode.
const NodeReadyTimeout = 2 * time.Minute

// startHollowNodes starts a hollow kubelet for every node, each under its
// own root directory in one temporary directory (kept short: unix socket
// paths live there), and waits until all are Ready with the driver
// registered.
func (e *Env) startHollowNodes(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "ll")
	if err != nil {
		return fmt.Errorf("hollow nodes: %w", err)
	}
	e.nodeDir = dir
	for i := range e.Opts.Nodes {
		name := NodeName(i + 1)
		root := filepath.Join(dir, fmt.Sprint(i+1))
		if err := os.MkdirAll(root, 0o700); err != nil {
			return fmt.Errorf("hollow node %s: %w", name, err)
		}
		h, err := e.stack.StartHollowNode(ctx, stack.HollowOptions{Name: name, RootDir: root, Output: e.Opts.ProcessOutput})
		if err != nil {
			return err
		}
		e.Hollow = append(e.Hollow, h)
	}
	for _, h := range e.Hollow {
		if err := e.waitNodeReady(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// waitNodeReady waits until h's Node is Ready and its CSINode lists the
// driver, or its kubelet exits.
func (e *Env) waitNodeReady(ctx context.Context, h *stack.HollowNode) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, NodeReadyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-h.Kubelet.Exited():
			return false, fmt.Errorf("its kubelet exited: %v", h.Kubelet.Result())
		default:
		}
		n, err := e.Client.CoreV1().Nodes().Get(ctx, h.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = "Node not registered yet"
			return false, nil
		}
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if !kube.NodeReady(n) {
			last = "Node not Ready"
			return false, nil
		}
		cn, err := e.Client.StorageV1().CSINodes().Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			last = "CSINode: " + err.Error()
			return false, nil
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == e.Opts.Driver {
				return true, nil
			}
		}
		last = "driver " + e.Opts.Driver + " not in its CSINode yet"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("hollow node %s not Ready with driver %s registered within %s (%s): %w", h.Name, e.Opts.Driver, NodeReadyTimeout, last, err)
	}
	return nil
}

// stopHollowNodes stops every hollow kubelet (and its node plugin) and
// removes their directories.
func (e *Env) stopHollowNodes() error {
	var errs []error
	for _, h := range e.Hollow {
		if err := h.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("hollow node %s: %w", h.Name, err))
		}
	}
	e.Hollow = nil
	if e.nodeDir != "" {
		os.RemoveAll(e.nodeDir)
		e.nodeDir = ""
	}
	return errors.Join(errs...)
}
