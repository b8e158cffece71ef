package attachdetach_test

// The suite's scenario helpers: objects the tests make and what they
// wait for.

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// --- objects ---

func (e *env) addNode(suffix string) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	if e.real != nil {
		return e.addHollowNode(name)
	}
	if err := e.kubelet.AddNode(e.ctx, localcluster.NodeConfig{Name: name, Drivers: map[string]string{e.driver: name + "-id"}}); err != nil {
		e.t.Fatal(err)
	}
	e.nodes = append(e.nodes, name)
	return name
}

// volume creates a bound PV+PVC of the test's driver; returns the PV name
// (= PVC name = volume handle).
func (e *env) volume(suffix string, modes ...v1.PersistentVolumeAccessMode) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	return e.volumeOf(e.driver, name, modes...)
}

func (e *env) volumeOf(driver, name string, modes ...v1.PersistentVolumeAccessMode) string {
	e.t.Helper()
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, localcluster.VolumeSpec{
		Namespace: e.ns, Name: name, Driver: driver, AccessModes: modes,
	}); err != nil {
		e.t.Fatal(err)
	}
	return name
}

func (e *env) pod(name, node string, claims ...string) *v1.Pod {
	e.t.Helper()
	p := localcluster.NewPod(e.ns, name, node, claims...)
	if e.real != nil {
		// The real kubelet would mount a service account token: no
		// root-ca publisher runs to give it the CA bundle.
		p.Spec.AutomountServiceAccountToken = new(false)
	}
	pod, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pod
}

func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) unique(pv string) v1.UniqueVolumeName { return kubenames.UniqueVolumeName(e.driver, pv) }

func (e *env) vaName(pv, node string) string {
	return kubenames.VolumeAttachmentName(pv, e.driver, node)
}

// --- polling ---

// timeout bounds each eventually of a stand-in env; a real-kubelet
// env waits realTimeout (the kubelet retries a mount that waits for
// its attach with a backoff that grows to minutes).
const (
	timeout     = 30 * time.Second
	realTimeout = 90 * time.Second
)

func (e *env) eventually(what string, cond func() (bool, error)) {
	e.t.Helper()
	testsupport.Eventually(e.t, e.ctx, e.wait, what, func(context.Context) (bool, error) { return cond() })
}

// consistently fails if cond turns false within d.
func (e *env) consistently(what string, d time.Duration, cond func() (bool, error)) {
	e.t.Helper()
	testsupport.Consistently(e.t, e.ctx, d, what, func(context.Context) (bool, error) { return cond() })
}

func (e *env) getVA(name string) (*storagev1.VolumeAttachment, bool) {
	va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		e.t.Fatalf("get VolumeAttachment %s: %v", name, err)
	}
	return va, true
}

func (e *env) waitAttachedVA(pv, node string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually("VolumeAttachment of "+pv+" on "+node+" attached", func() (bool, error) {
		v, ok := e.getVA(e.vaName(pv, node))
		va = v
		return ok && v.Status.Attached, nil
	})
	return va
}

// runningPod starts Pod "app" on a new node n1 with a new ReadWriteOnce
// volume (suffix) and waits until the volume is attached and the Pod runs.
func (e *env) runningPod(suffix string) (node, pv string, va *storagev1.VolumeAttachment) {
	e.t.Helper()
	node = e.addNode("n1")
	pv = e.volume(suffix, rwo())
	e.pod("app", node, pv)
	va = e.waitAttachedVA(pv, node)
	e.waitPodRunning("app")
	return node, pv, va
}

// createVA creates a VolumeAttachment of the test's driver for pv on node
// as another client would (no Pod asked for it).
func (e *env) createVA(pv, node string) {
	e.t.Helper()
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: e.vaName(pv, node)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: e.driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create VolumeAttachment of %s on %s: %v", pv, node, err)
	}
}

// waitVAGone waits until the VolumeAttachment of pv on node is gone. In
// a real-kubelet env that is a detach after an unmount, and it is
// checked against the kubelet ordering contract (checkDetach).
func (e *env) waitVAGone(pv, node string) {
	e.t.Helper()
	e.eventually("VolumeAttachment of "+pv+" on "+node+" deleted", func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return !ok, nil
	})
	if e.real != nil {
		e.checkDetach(pv, node)
	}
}

func (e *env) node(name string) *v1.Node {
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

func attachedNames(n *v1.Node) []v1.UniqueVolumeName {
	var out []v1.UniqueVolumeName
	for _, av := range n.Status.VolumesAttached {
		out = append(out, av.Name)
	}
	return out
}

// waitNodeAttached waits until node's status.volumesAttached is exactly want.
func (e *env) waitNodeAttached(node string, want ...v1.UniqueVolumeName) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("node %s volumesAttached = %v", node, want), func() (bool, error) {
		got := attachedNames(e.node(node))
		if len(got) != len(want) {
			return false, nil
		}
		for i := range got {
			if got[i] != want[i] {
				return false, nil
			}
		}
		return true, nil
	})
}

// waitPodRunning waits until Pod name runs. In a real-kubelet env each
// of its attachable volumes' attach is then checked against the kubelet
// ordering contract (checkAttach).
func (e *env) waitPodRunning(name string) {
	e.t.Helper()
	var pod *v1.Pod
	e.eventually("pod "+name+" running", func() (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		pod = p
		return err == nil && p.Status.Phase == v1.PodRunning, nil
	})
	if e.real != nil {
		e.checkPodAttaches(pod)
	}
}

func (e *env) waitPodGone(name string) {
	e.t.Helper()
	e.eventually("pod "+name+" gone", func() (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// events returns the controller's events on the pod with reason.
func (e *env) events(pod, reason string) []v1.Event {
	e.t.Helper()
	list, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.name": pod, "reason": reason, "source": controller.EventComponent,
	}.AsSelector().String()})
	if err != nil {
		e.t.Fatalf("list events: %v", err)
	}
	return list.Items
}

func (e *env) waitEvent(pod, reason, message string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("event %s %q on pod %s", reason, message, pod), func() (bool, error) {
		for _, ev := range e.events(pod, reason) {
			if ev.Message == message {
				return true, nil
			}
		}
		return false, nil
	})
}

// controllerWrites returns the controller's successful API writes so far.
// waitControllerWrites waits until the controller's API writes are
// exactly want, in order, and fails at once on a write that is not. A
// write is recorded when its response arrives, which can be a moment
// after the test saw its effect.
func (e *env) waitControllerWrites(want []string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("controller API writes %q", want), func() (bool, error) {
		got := e.controllerWrites()
		if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
			return false, fmt.Errorf("controller API writes:\n got %q\nwant %q", got, want)
		}
		return len(got) == len(want), nil
	})
}

func (e *env) controllerWrites() []string {
	var out []string
	for _, w := range e.ctrlAPI.Writes() {
		if w.Resource != "events" && w.Err == nil && w.Code < 300 {
			out = append(out, w.Method+" "+w.Path)
		}
	}
	return out
}
