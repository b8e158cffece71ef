// Package attacher_test runs csi-attacher end to end: the same RunSidecar
// the binary runs, against the in-process kube-apiserver and the mock CSI
// driver over a real unix socket.
package attacher_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

var (
	runsMu sync.Mutex
	runs   = map[string]int{}
)

func TestMain(m *testing.M) {
	code := localcluster.RunTestMain(m, &cluster)
	testsupport.RemoveBinaries()
	os.Exit(code)
}

type env struct {
	t       *testing.T
	ctx     context.Context
	client  kubernetes.Interface
	driver  *csimock.Driver
	name    string // driver name
	socket  string
	writes  *testsupport.APITransport // the first replica's API writes
	node    string
	nodeID  string
	prefix  string
	stopAtt func()
	// kubeconfigPath is written on first use by kubeconfig().
	kubeconfigPath string
}

type envOptions struct {
	caps          *csimock.Capabilities
	reconcileSync time.Duration
	noCSINode     bool
	leader        bool
	// noAttacher: the test starts attachers itself (the binary, say).
	noAttacher bool
	// driverName overrides the test-unique driver name (CSI migration
	// needs the real name of a migrated driver).
	driverName string
	// competing receives the replica's latch_attacher_competing_instances
	// value (nil: the legacy registry's gauge, as in the binary).
	competing app.GaugeSetter
	// logger replaces klog's for this replica.
	logger *klog.Logger
}

// newEnv starts a mock driver with a driver name unique to the test, a node
// with a CSINode entry for it, and one attacher.
func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	prefix := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(prefix) > 40 {
		prefix = prefix[len(prefix)-40:]
		prefix = strings.TrimLeft(prefix, "-")
	}
	// Runs of one test in the same process (-count=N) share the API
	// server: give every repeat names of its own.
	runsMu.Lock()
	if n := runs[t.Name()]; n > 0 {
		prefix = fmt.Sprintf("%s-r%d", prefix, n)
	}
	runs[t.Name()]++
	runsMu.Unlock()
	e := &env{
		t: t, ctx: ctx, client: cluster.Client(),
		name:   prefix + ".csi.latch.dev",
		writes: testsupport.NewAPITransport(),
		node:   prefix + "-node", nodeID: prefix + "-node-id",
		prefix: prefix,
	}
	// Unix socket paths are limited to ~100 bytes: keep them short.
	dir, err := os.MkdirTemp("", "latch-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e.socket = filepath.Join(dir, "csi.sock")
	if o.driverName != "" {
		e.name = o.driverName
	}

	e.driver, err = stack.MockDriver(ctx, e.name, e.socket, func(cfg *csimock.Config) {
		if o.caps != nil {
			cfg.Capabilities = *o.caps
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.driver.Stop)

	if !o.noCSINode {
		e.createCSINode(e.node, e.nodeID)
	}
	e.stopAtt = func() {}
	if !o.noAttacher {
		e.stopAtt = e.startAttacher(o, "")
	}
	t.Cleanup(func() { e.stopAtt() })
	return e
}

// startAttacher runs one attacher replica; the returned func stops it and
// waits for it to exit.
func (e *env) startAttacher(o envOptions, identity string) func() {
	cfg := cluster.RESTConfig()
	cfg.WrapTransport = e.writes.Wrap
	return e.startAttacherAs(cfg, o, identity, "default")
}

// startAttacherAs runs a replica with the given client config, leader
// election (when on) in leaseNamespace.
func (e *env) startAttacherAs(cfg *rest.Config, o envOptions, identity, leaseNamespace string) func() {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	logger := klog.Background().WithName(identity)
	if o.logger != nil {
		logger = o.logger.WithName(identity)
	}
	go func() {
		done <- attacher.RunSidecar(klog.NewContext(ctx, logger), e.attacherConfig(cfg, o, identity, leaseNamespace))
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					e.t.Errorf("attacher %q exited with error: %v", identity, err)
				}
			case <-time.After(time.Minute):
				e.t.Errorf("attacher %q did not stop within a minute", identity)
			}
		})
	}
}

// attacherConfig is the binary's configuration (stack.AttacherConfig)
// with what the suite needs faster: short CSI timeout and retries, a quick
// Lease, and the replica's leader election.
func (e *env) attacherConfig(cfg *rest.Config, o envOptions, identity, leaseNamespace string) attacher.SidecarConfig {
	c := stack.AttacherConfig(cfg, e.socket)
	c.RESTConfig.QPS, c.RESTConfig.Burst = cfg.QPS, cfg.Burst
	c.ConnectTimeout = 30 * time.Second
	c.DefaultFSType = "ext4"
	c.Controller.Workers = 10
	c.Controller.Timeout = 5 * time.Second
	c.Controller.RetryIntervalStart = 100 * time.Millisecond
	c.Controller.SecretRetryInterval = 500 * time.Millisecond
	c.Controller.ReconcileSync = o.reconcileSync
	c.Leader = app.LeaderElection{
		Enabled: o.leader, Namespace: leaseNamespace, Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond,
		// As the binary: without leader election, still hold the Lease
		// and refuse work while another replica does.
		Presence: &app.Presence{Component: "csi-attacher", Competing: o.competing},
	}
	return c
}

func (e *env) createCSINode(node, nodeID string) {
	e.t.Helper()
	n := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: e.name, NodeID: nodeID}}},
	}
	if _, err := e.client.StorageV1().CSINodes().Create(e.ctx, n, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create CSINode %s: %v", node, err)
	}
}

func (e *env) createPV(name string, mods ...func(*localcluster.VolumeSpec)) {
	e.t.Helper()
	spec := localcluster.VolumeSpec{Namespace: "default", Name: name, Driver: e.name}
	for _, m := range mods {
		m(&spec)
	}
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, spec); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) newVA(name, pv, node string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: e.name, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
}

func (e *env) createVA(va *storagev1.VolumeAttachment) {
	e.t.Helper()
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create VolumeAttachment %s: %v", va.Name, err)
	}
}

func (e *env) getVA(name string) *storagev1.VolumeAttachment {
	e.t.Helper()
	va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get VolumeAttachment %s: %v", name, err)
	}
	return va
}

// eventually polls cond until it holds or the timeout passes; on failure
// it logs the driver's VolumeAttachments.
func (e *env) eventually(timeout time.Duration, what string, cond func() (bool, error)) {
	e.t.Helper()
	testsupport.Eventually(e.t, e.ctx, timeout, what, func(context.Context) (bool, error) { return cond() }, e.logVAs)
}

func (e *env) logVAs() {
	vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil || len(vas.Items) >= 50 {
		return
	}
	for _, va := range vas.Items {
		if va.Spec.Attacher == e.name {
			e.t.Logf("VA %s: attached=%v attachError=%+v detachError=%+v finalizers=%v", va.Name, va.Status.Attached, va.Status.AttachError, va.Status.DetachError, va.Finalizers)
		}
	}
}

func (e *env) waitAttached(name string, timeout time.Duration) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually(timeout, fmt.Sprintf("VolumeAttachment %s attached", name), func() (bool, error) {
		var err error
		va, err = e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && va.Status.Attached, nil
	})
	return va
}

func (e *env) waitAttachError(name, substring string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually(30*time.Second, fmt.Sprintf("attachError containing %q on %s", substring, name), func() (bool, error) {
		var err error
		va, err = e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && va.Status.AttachError != nil && strings.Contains(va.Status.AttachError.Message, substring), nil
	})
	if va == nil || va.Status.AttachError == nil {
		e.t.Fatalf("no attachError on %s", name)
	}
	return va
}

func (e *env) waitGone(name string) {
	e.t.Helper()
	e.eventually(30*time.Second, fmt.Sprintf("VolumeAttachment %s gone", name), func() (bool, error) {
		_, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

func (e *env) deleteVA(name string) {
	e.t.Helper()
	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete VolumeAttachment %s: %v", name, err)
	}
}

// eventMessage returns the message of the first event with reason on the
// named VolumeAttachment, waiting for it to be recorded.
func (e *env) eventMessage(name, reason string) string {
	e.t.Helper()
	var msg string
	e.eventually(10*time.Second, fmt.Sprintf("%s event on %s", reason, name), func() (bool, error) {
		events, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		for _, ev := range events.Items {
			if ev.Reason == reason {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}
