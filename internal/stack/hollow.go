package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport"
)

// A hollow node is one simulated node run by the real kubelet: the
// hollow-kubelet child process (Kubernetes v1.37.2's kubelet with
// kubemark's fake container runtime and fake mounter, controller-managed
// attach/detach; test/upstream/kubernetes/hollowkubelet) and, beside it,
// the mock driver's node plugin for that node: a csimock node endpoint on
// <root>/plugins/<driver>/csi.sock that reports node ID NodeID(name), with
// the plugin-registration socket in <root>/plugins_registry, so that the
// kubelet registers the driver and writes the node's CSINode itself, then
// stages and publishes the node's CSI volumes through it.
// HollowOptions.ExtraDrivers adds the node plugins of more mock drivers
// beside it, registered the same way.

// HollowOptions shape one hollow node.
type HollowOptions struct {
	// Name is the Node's name.
	Name string
	// RootDir is the kubelet's --root-dir (plugins_registry, plugins and
	// pods live there); it must exist. Unix socket paths under it must
	// stay within 107 bytes: keep it short.
	RootDir string
	// Output receives the kubelet's log (nil: discarded).
	Output io.Writer
	// Args are extra flags of hollow-kubelet (-v=4, say).
	Args []string
	// MaxVolumes, when positive, is the node's CSI attach limit: the mock
	// driver's NodeGetInfo reports it (the kubelet writes it into the
	// CSINode as the driver's allocatable count) and its
	// ControllerPublishVolume to this node refuses more.
	MaxVolumes int64
	// ExtraDrivers are more mock drivers whose node plugin runs on this
	// node beside the stack's: for each, a node endpoint for the node
	// (node ID NodeID(Name)) on <root>/plugins/<its name>/csi.sock with
	// its registration socket in the same plugins_registry, so the
	// kubelet registers every driver in the node's CSINode and mounts
	// each driver's volumes through its own plugin. The caller makes
	// each driver (csimock.New, a name of its own; it need not serve its
	// controller socket) and owns it; the endpoints stop with the node.
	ExtraDrivers []*csimock.Driver
}

// HollowNode is a running hollow node; Stop ends it.
type HollowNode struct {
	Name    string
	RootDir string
	// Port is the kubelet's loopback port.
	Port int
	// Kubelet is the hollow-kubelet process.
	Kubelet *Component
	// Endpoint is the mock driver's node plugin on this node.
	Endpoint *csimock.NodeEndpoint
	// ExtraEndpoints are HollowOptions.ExtraDrivers' node plugins on this
	// node, in that order.
	ExtraEndpoints []*csimock.NodeEndpoint

	bin    string
	args   []string
	output io.Writer
	// crash SIGKILLs the running kubelet's process.
	crash func()
}

// maxSocketPath is the longest unix socket path Linux accepts (108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// StartHollowNode starts the mock driver's node endpoint for o.Name, then
// a hollow kubelet for it against the stack's cluster. The stack must run
// the mock driver (an attacher mode other than trivial or none). The
// kubelet registers its Node; wait for it to be Ready and for its CSINode
// to list the driver before relying on it.
func (s *Stack) StartHollowNode(ctx context.Context, o HollowOptions) (_ *HollowNode, err error) {
	if s.Driver == nil {
		return nil, errors.New("hollow node: the stack runs no mock driver")
	}
	if o.Name == "" || o.RootDir == "" {
		return nil, errors.New("hollow node: Name and RootDir are required")
	}
	bin, err := testsupport.UpstreamBinary("hollow-kubelet")
	if err != nil {
		return nil, fmt.Errorf("hollow node %s: %w", o.Name, err)
	}
	regDir := filepath.Join(o.RootDir, "plugins_registry")
	drivers := append([]*csimock.Driver{s.Driver}, o.ExtraDrivers...)
	sockets := make([]string, len(drivers))
	for i, d := range drivers {
		name := d.Config().Name
		for _, other := range drivers[:i] {
			if other.Config().Name == name {
				return nil, fmt.Errorf("hollow node %s: two node plugins of driver %s", o.Name, name)
			}
		}
		sockets[i] = filepath.Join(o.RootDir, "plugins", name, "csi.sock")
		for _, p := range []string{sockets[i], filepath.Join(regDir, name+"-reg.sock")} {
			if len(p) > maxSocketPath {
				return nil, fmt.Errorf("hollow node %s: socket path %s is %d bytes, over the %d-byte unix limit: use a shorter RootDir", o.Name, p, len(p), maxSocketPath)
			}
		}
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, fmt.Errorf("hollow node %s: %w", o.Name, err)
	}
	kubeconfig := filepath.Join(o.RootDir, "kubeconfig")
	if err := s.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		return nil, fmt.Errorf("hollow node %s: %w", o.Name, err)
	}
	h := &HollowNode{Name: o.Name, RootDir: o.RootDir, Port: port, bin: bin, output: o.Output}
	defer func() {
		if err != nil {
			_ = h.Stop()
		}
	}()
	for i, d := range drivers {
		cfg := csimock.NodeConfig{NodeID: NodeID(o.Name), Socket: sockets[i], RegistrationDir: regDir}
		if i == 0 {
			cfg.MaxVolumes = o.MaxVolumes // the stack's driver only
		}
		ep, err := d.StartNode(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("hollow node %s: node plugin of driver %s: %w", o.Name, d.Config().Name, err)
		}
		if i == 0 {
			h.Endpoint = ep
		} else {
			h.ExtraEndpoints = append(h.ExtraEndpoints, ep)
		}
	}
	h.args = append([]string{
		"--kubeconfig=" + kubeconfig, "--name=" + o.Name, "--root-dir=" + o.RootDir, "--port=" + strconv.Itoa(port),
	}, o.Args...)
	if err := h.StartKubelet(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// StartKubelet starts the node's kubelet again, with the same name, root
// directory, port and flags, after StopKubelet or KillKubelet: a kubelet
// restart. It becomes h.Kubelet.
func (h *HollowNode) StartKubelet(ctx context.Context) error {
	if h.Kubelet != nil {
		select {
		case <-h.Kubelet.Exited():
		default:
			return fmt.Errorf("hollow node %s: the kubelet still runs", h.Name)
		}
	}
	// hollow-kubelet ends on SIGTERM with status 0, without touching its
	// Pods or volumes, as a kubelet without graceful node shutdown does.
	c, crash, err := child(ctx, "hollow-kubelet-"+h.Name, h.output, exitedZero, h.bin, h.args...)
	if err != nil {
		return fmt.Errorf("hollow node %s: start hollow-kubelet: %w", h.Name, err)
	}
	h.Kubelet, h.crash = c, crash
	return nil
}

// StopKubelet stops the kubelet (SIGTERM) and waits for it; the node
// endpoint keeps serving, as the driver's node plugin outlives a kubelet
// restart.
func (h *HollowNode) StopKubelet() error {
	if h.Kubelet == nil {
		return nil
	}
	return h.Kubelet.Stop()
}

// KillKubelet kills the kubelet (SIGKILL) and waits for it to be gone: a
// kubelet that stops reporting at once. The node endpoint keeps serving.
func (h *HollowNode) KillKubelet() error {
	if h.Kubelet == nil || h.crash == nil {
		return fmt.Errorf("hollow node %s: no kubelet to kill", h.Name)
	}
	h.crash()
	<-h.Kubelet.Exited()
	return nil
}

// Stop stops the kubelet (SIGTERM), then the node endpoints. The Node and
// CSINode objects stay, as after a node's kubelet stopped.
func (h *HollowNode) Stop() error {
	var err error
	if h.Kubelet != nil {
		err = h.Kubelet.Stop()
	}
	if h.Endpoint != nil {
		h.Endpoint.Stop()
	}
	for _, ep := range h.ExtraEndpoints {
		ep.Stop()
	}
	return err
}

// freeLoopbackPort is testsupport.FreeLoopbackAddr's port.
func freeLoopbackPort() (int, error) {
	addr, err := testsupport.FreeLoopbackAddr()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	return strconv.Atoi(port)
}
