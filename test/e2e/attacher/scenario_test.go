package attacher_test

// The suite's scenario helpers: objects the tests make and what they
// wait for.

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

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

// createPVWithSecret creates the Secret default/secret holding data and
// a PV whose controller-publish secret it is.
func (e *env) createPVWithSecret(pv, secret string, data map[string]string) {
	e.t.Helper()
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: secret}, StringData: data}
	if _, err := e.client.CoreV1().Secrets("default").Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create Secret default/%s: %v", secret, err)
	}
	e.createPV(pv, func(s *localcluster.VolumeSpec) {
		s.SecretRef = &v1.SecretReference{Namespace: "default", Name: secret}
	})
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

// attachOne creates the test's PV (prefix-pv) and its VolumeAttachment
// (prefix-va) on the test's node, and waits up to timeout for the attach.
func (e *env) attachOne(timeout time.Duration) (pv, vaName string, va *storagev1.VolumeAttachment) {
	e.t.Helper()
	pv, vaName = e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	return pv, vaName, e.waitAttached(vaName, timeout)
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
