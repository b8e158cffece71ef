package reliability_test

// The suite's scenario helpers: objects the tests make and what they
// wait for.

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// --- objects ---

func (e *env) addNode(suffix string) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	if err := e.kubelet.AddNode(e.ctx, localcluster.NodeConfig{Name: name, Drivers: map[string]string{e.driver: e.nodeID(name)}}); err != nil {
		e.t.Fatal(err)
	}
	e.nodes = append(e.nodes, name)
	return name
}

func (e *env) nodeID(node string) string { return node + "-id" }

// volume creates a bound ReadWriteOnce PV+PVC of the test's driver; the PV,
// the PVC and the volume handle share the name.
func (e *env) volume(suffix string) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	spec := localcluster.VolumeSpec{Namespace: e.ns, Name: name, Driver: e.driver}
	if e.opts.secret != nil {
		spec.SecretRef = &v1.SecretReference{Namespace: e.ns, Name: "publish-secret"}
	}
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, spec); err != nil {
		e.t.Fatal(err)
	}
	return name
}

// volumes creates n volumes (volume), named v0 to v(n-1).
func (e *env) volumes(n int) []string {
	e.t.Helper()
	pvs := make([]string, n)
	for i := range pvs {
		pvs[i] = e.volume(fmt.Sprintf("v%d", i))
	}
	return pvs
}

// podsOn starts, for each volume, a Pod on node using it, named prefix
// and the volume's index, and waits until every volume is attached there.
func (e *env) podsOn(prefix, node string, pvs []string) {
	e.t.Helper()
	for i, pv := range pvs {
		e.pod(fmt.Sprintf("%s%d", prefix, i), node, pv)
	}
	for _, pv := range pvs {
		e.waitAttached(pv, node)
	}
}

// aliasVolume creates a bound ReadWriteMany PV+PVC (named after suffix)
// whose volume handle is that of the PV handleOf: a second name for the
// same unique volume.
func (e *env) aliasVolume(suffix, handleOf string) string {
	e.t.Helper()
	pv, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, handleOf, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	name := e.prefix + "-" + suffix
	spec := localcluster.VolumeSpec{
		Namespace: e.ns, Name: name, Driver: e.driver, Handle: pv.Spec.CSI.VolumeHandle,
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
		SecretRef:   pv.Spec.CSI.ControllerPublishSecretRef,
	}
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, spec); err != nil {
		e.t.Fatal(err)
	}
	return name
}

func (e *env) pod(name, node string, claims ...string) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, localcluster.NewPod(e.ns, name, node, claims...), metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create pod %s: %v", name, err)
	}
}

func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
}

func (e *env) vaName(pv, node string) string {
	return kubenames.VolumeAttachmentName(pv, e.driver, node)
}

// --- polling ---

func (e *env) eventually(timeout time.Duration, what string, cond func() bool) {
	e.t.Helper()
	testsupport.Eventually(e.t, e.ctx, timeout, what, func(context.Context) (bool, error) { return cond(), nil }, e.dump)
}

// dump logs the test's VolumeAttachments and the driver's publications.
func (e *env) dump() {
	vas := e.vas()
	for i, va := range vas {
		if i == 30 {
			e.t.Logf("... and %d more VolumeAttachments", len(vas)-30)
			break
		}
		e.t.Logf("VA %s pv=%v node=%s attached=%v attachError=%v detachError=%v deleting=%v finalizers=%v",
			va.Name, ptrStr(va.Spec.Source.PersistentVolumeName), va.Spec.NodeName, va.Status.Attached, va.Status.AttachError,
			va.Status.DetachError, va.DeletionTimestamp != nil, va.Finalizers)
	}
	for _, v := range e.mock.State().Volumes {
		if len(v.Published) > 0 {
			e.t.Logf("driver: volume %s published to %v", v.ID, v.Published)
		}
	}
}

func ptrStr(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func (e *env) waitAttached(pv, node string) {
	e.t.Helper()
	name := e.vaName(pv, node)
	e.eventually(60*time.Second, fmt.Sprintf("VolumeAttachment of %s on %s attached", pv, node), func() bool {
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && va.Status.Attached
	})
}

func (e *env) waitGone(pv, node string) {
	e.t.Helper()
	name := e.vaName(pv, node)
	e.eventually(60*time.Second, fmt.Sprintf("VolumeAttachment of %s on %s gone", pv, node), func() bool {
		_, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}
