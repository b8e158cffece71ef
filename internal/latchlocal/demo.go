package latchlocal

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// Step is one observed milestone of the demo.
type Step struct {
	Phase string `json:"phase"`
	Name  string `json:"name"`
	// At is the time since the demo started; Latency the time since the
	// action that started this phase (Pod created or deleted).
	At      time.Duration `json:"at"`
	Latency time.Duration `json:"latency"`
	Detail  string        `json:"detail,omitempty"`
}

// Result is the demo's outcome.
type Result struct {
	Steps      []Step `json:"steps"`
	OK         bool   `json:"ok"`
	FailedStep string `json:"failedStep,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Reporter is told about progress as it happens.
type Reporter interface {
	Phase(name string)
	Waiting(step string)
	Step(s Step)
}

// StepTimeout bounds each wait of the demo.
const StepTimeout = 60 * time.Second

type demo struct {
	e      *Env
	rep    Reporter
	start  time.Time
	mark   time.Time // start of the current phase
	phase  string
	result Result
}

// RunDemo walks a Pod's volume through attach, a multi-attach conflict and
// detach, reporting each milestone. The returned Result says which step
// failed, if any.
func RunDemo(ctx context.Context, e *Env, rep Reporter) Result {
	d := &demo{e: e, rep: rep, start: time.Now()}
	if err := d.run(ctx); err != nil {
		d.result.Error = err.Error()
		return d.result
	}
	d.result.OK = true
	return d.result
}

func (d *demo) run(ctx context.Context) error {
	e := d.e
	const ns, pvc = "default", "demo-volume"
	driver := e.Opts.Driver
	node1, node2 := NodeName(1), NodeName(2)
	unique := kubenames.UniqueVolumeName(driver, pvc)
	va1 := kubenames.VolumeAttachmentName(pvc, driver, node1)
	va2 := kubenames.VolumeAttachmentName(pvc, driver, node2)

	d.begin("attach")
	if _, _, err := localcluster.CreateBoundVolume(ctx, e.Client, localcluster.VolumeSpec{
		Namespace: ns, Name: pvc, Driver: driver, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
	}); err != nil {
		return d.fail("PV and PVC created", err)
	}
	d.step("PV and PVC created", fmt.Sprintf("%s (ReadWriteOnce, driver %s)", pvc, driver))
	if err := d.createPod(ctx, ns, "app-1", node1, pvc); err != nil {
		return err
	}
	if err := d.attachSteps(ctx, ns, "app-1", node1, NodeID(1), va1, pvc, unique); err != nil {
		return err
	}

	d.begin("multi-attach")
	if err := d.createPod(ctx, ns, "app-2", node2, pvc); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "Multi-Attach error reported on app-2", func() (bool, string, error) {
		ev, err := podEvent(ctx, e, ns, "app-2", "FailedAttachVolume", "Multi-Attach error")
		return ev != "", ev, err
	}); err != nil {
		return err
	}
	if n := e.Driver.PublishCount(pvc, NodeID(2)); n != 0 {
		return d.fail("no publish to "+node2+" while "+node1+" holds the volume", fmt.Errorf("driver published the volume to %s %d times", node2, n))
	}
	d.step("no publish to "+node2+" while "+node1+" holds the volume", "")

	d.begin("detach")
	if err := e.Client.CoreV1().Pods(ns).Delete(ctx, "app-1", metav1.DeleteOptions{}); err != nil {
		return d.fail("Pod app-1 deleted", err)
	}
	d.step("Pod app-1 deleted", "")
	if err := d.nodeCallSteps(ctx, NodeID(1), pvc, "NodeUnpublishVolume", "NodeUnstageVolume"); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "kubelet released the volume (volumesInUse)", func() (bool, string, error) {
		n, err := e.Client.CoreV1().Nodes().Get(ctx, node1, metav1.GetOptions{})
		return err == nil && !slices.Contains(n.Status.VolumesInUse, unique), node1, nil
	}); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "ControllerUnpublishVolume succeeded", func() (bool, string, error) {
		return !slices.Contains(e.Driver.Published(pvc), NodeID(1)), "node ID " + NodeID(1), nil
	}); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "VolumeAttachment deleted", func() (bool, string, error) {
		_, err := e.Client.StorageV1().VolumeAttachments().Get(ctx, va1, metav1.GetOptions{})
		return apierrors.IsNotFound(err), va1, nil
	}); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "node status updated", func() (bool, string, error) {
		n, err := e.Client.CoreV1().Nodes().Get(ctx, node1, metav1.GetOptions{})
		return err == nil && !attachedIn(n, unique), node1 + " no longer lists the volume", nil
	}); err != nil {
		return err
	}

	d.begin("conflict resolved")
	if err := d.attachSteps(ctx, ns, "app-2", node2, NodeID(2), va2, pvc, unique); err != nil {
		return err
	}

	d.begin("cleanup")
	if err := e.Client.CoreV1().Pods(ns).Delete(ctx, "app-2", metav1.DeleteOptions{}); err != nil {
		return d.fail("Pod app-2 deleted", err)
	}
	d.step("Pod app-2 deleted", "")
	return d.waitFor(ctx, "VolumeAttachment deleted", func() (bool, string, error) {
		_, err := e.Client.StorageV1().VolumeAttachments().Get(ctx, va2, metav1.GetOptions{})
		return apierrors.IsNotFound(err), va2, nil
	})
}

func (d *demo) attachSteps(ctx context.Context, ns, pod, node, nodeID, vaName, handle string, unique v1.UniqueVolumeName) error {
	e := d.e
	if err := d.waitFor(ctx, "VolumeAttachment created", func() (bool, string, error) {
		_, err := e.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		return err == nil, vaName, nil
	}); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "ControllerPublishVolume succeeded", func() (bool, string, error) {
		return e.Driver.PublishCount(handle, nodeID) > 0, "node ID " + nodeID, nil
	}); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "VolumeAttachment attached", func() (bool, string, error) {
		va, err := e.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		return err == nil && va.Status.Attached, "status.attached=true", nil
	}); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "node status updated", func() (bool, string, error) {
		n, err := e.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && attachedIn(n, unique), node + " lists " + string(unique), nil
	}); err != nil {
		return err
	}
	if err := d.nodeCallSteps(ctx, nodeID, handle, "NodeStageVolume", "NodePublishVolume"); err != nil {
		return err
	}
	return d.waitFor(ctx, "Pod Running", func() (bool, string, error) {
		p, err := e.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, pod + " on " + node, nil
	})
}

func (d *demo) createPod(ctx context.Context, ns, name, node, claim string) error {
	if _, err := d.e.Client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, name, node, claim), metav1.CreateOptions{}); err != nil {
		return d.fail("Pod "+name+" created", err)
	}
	d.step("Pod "+name+" created", "on "+node)
	return nil
}

func (d *demo) begin(phase string) {
	d.phase = phase
	d.mark = time.Now()
	d.rep.Phase(phase)
}

func (d *demo) step(name, detail string) {
	now := time.Now()
	s := Step{Phase: d.phase, Name: name, At: now.Sub(d.start), Latency: now.Sub(d.mark), Detail: detail}
	d.result.Steps = append(d.result.Steps, s)
	d.rep.Step(s)
}

func (d *demo) fail(step string, err error) error {
	d.result.FailedStep = step
	return fmt.Errorf("%s: %w", step, err)
}

// waitFor polls cond until it holds, then records the step.
func (d *demo) waitFor(ctx context.Context, step string, cond func() (bool, string, error)) error {
	d.rep.Waiting(step)
	var detail string
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, StepTimeout, true, func(context.Context) (bool, error) {
		ok, det, err := cond()
		detail = det
		return ok, err
	})
	if err != nil {
		return d.fail(step, fmt.Errorf("not seen within %s: %w", StepTimeout, err))
	}
	d.step(step, detail)
	return nil
}

func attachedIn(n *v1.Node, unique v1.UniqueVolumeName) bool {
	for _, av := range n.Status.VolumesAttached {
		if av.Name == unique {
			return true
		}
	}
	return false
}

func podEvent(ctx context.Context, e *Env, ns, pod, reason, contains string) (string, error) {
	events, err := e.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return "", nil
	}
	for _, ev := range events.Items {
		if ev.Reason == reason && strings.Contains(ev.Message, contains) {
			return ev.Message, nil
		}
	}
	return "", nil
}

// nodeCallSteps records, with real nodes, the kubelet's calls of methods
// for volume on node nodeID's plugin as steps, each once it succeeded; the
// kubelet stand-in makes no such calls.
func (d *demo) nodeCallSteps(ctx context.Context, nodeID, volume string, methods ...string) error {
	if !d.e.Opts.RealNodes {
		return nil
	}
	for _, m := range methods {
		if err := d.waitFor(ctx, m+" succeeded", func() (bool, string, error) {
			for _, c := range d.e.Driver.NodeCalls(nodeID) {
				if c.Method == m && c.VolumeID == volume && c.Done() && c.Code == codes.OK {
					return true, "by the kubelet on node ID " + nodeID, nil
				}
			}
			return false, "", nil
		}); err != nil {
			return err
		}
	}
	return nil
}
