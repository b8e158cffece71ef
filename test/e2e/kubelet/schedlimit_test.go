package kubelet_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// maxVolumeCountReason is the reason kube-scheduler v1.36's
// NodeVolumeLimits plugin (pkg/scheduler/framework/plugins/
// nodevolumelimits, ErrReasonMaxVolumeCountExceeded) gives a node whose
// CSINode allocatable count the Pod's CSI volumes would exceed.
const maxVolumeCountReason = "node(s) exceed max volume count"

// scheduler is kube-scheduler's name on the events and Pods it writes.
const scheduler = "default-scheduler"

// TestSchedulerCSIVolumeLimit: the real kube-scheduler places Pods (no
// spec.nodeName set by the test) on two hollow nodes whose driver reports
// max_volumes_per_node 1 (the kubelet writes it as each CSINode's
// allocatable count). Three Pods, each with its own volume, are created
// together: two are scheduled, one per node, attached, mounted and
// Running; the third stays Pending with the scheduler's FailedScheduling
// event naming the volume limit, and nothing is ever attached for it
// while it waits. When one running Pod is deleted, its volume is
// unmounted before it is detached, and the scheduler places the waiting
// Pod on the freed node only once that VolumeAttachment is gone (v1.36's
// plugin counts a node's VolumeAttachments as well as its Pods); it is
// then attached and runs. The driver never refuses a ControllerPublish:
// the scheduler, not the driver, held the third volume back.
func TestSchedulerCSIVolumeLimit(t *testing.T) {
	start := time.Now()
	r := newSchedulerRig(t, 7*time.Minute)
	nodeA, nodeB := r.addNode("a", 1), r.addNode("b", 1)
	r.waitAllocatable(nodeA, 1)
	r.waitAllocatable(nodeB, 1)
	t.Logf("scheduler serving, nodes %s and %s Ready with allocatable count 1 after %s", nodeA.Name, nodeB.Name, time.Since(start).Round(time.Millisecond))

	pods := []string{"app-0", "app-1", "app-2"}
	volOf := map[string]string{}
	for i, p := range pods {
		volOf[p] = r.preboundVolume("vol-" + strconv.Itoa(i))
	}
	for _, p := range pods {
		r.unscheduledPod(p, volOf[p])
	}

	// Two Pods placed, one per node; the third refused by the limit.
	var placed []string
	var waiting string
	testsupport.Eventually(t, r.ctx, 90*time.Second, "two Pods scheduled and the third refused for the volume limit", func(ctx context.Context) (bool, error) {
		placed, waiting = nil, ""
		for _, name := range pods {
			p, ok, err := r.getPod(ctx, name)
			if err != nil || !ok {
				return false, err
			}
			if p.Spec.NodeName != "" {
				placed = append(placed, name)
			} else {
				waiting = name
			}
		}
		if len(placed) < 2 {
			return false, nil
		}
		if len(placed) == 3 {
			t.Fatalf("all three Pods scheduled on two nodes with a limit of 1 volume each")
		}
		e, err := r.podEvent(ctx, waiting, "FailedScheduling", maxVolumeCountReason, scheduler)
		return e != nil, err
	}, r.dumpCalls)
	t.Logf("placed %v, %s waits, after %s", placed, waiting, time.Since(start).Round(time.Millisecond))

	onNode := map[string]*node{} // Pod → its node
	for _, name := range placed {
		r.waitPodRunning(name, 2*time.Minute)
		p, _, err := r.getPod(r.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		n := r.nodes[p.Spec.NodeName]
		if n == nil || !podScheduledBy(p, scheduler) {
			t.Fatalf("Pod %s: node %q, scheduler %q, PodScheduled %v; want one of the rig's nodes chosen by default-scheduler", name, p.Spec.NodeName, p.Spec.SchedulerName, condition(p, v1.PodScheduled))
		}
		if e, err := r.podEvent(r.ctx, name, "Scheduled", p.Spec.NodeName, scheduler); err != nil || e == nil {
			t.Errorf("no Scheduled event from default-scheduler naming %s on Pod %s (err %v)", p.Spec.NodeName, name, err)
		}
		onNode[name] = n
		r.checkAttach(volOf[name], n, name)
	}
	if onNode[placed[0]] == onNode[placed[1]] {
		t.Fatalf("Pods %v both scheduled to %s, whose limit is 1 volume", placed, onNode[placed[0]].Name)
	}

	// The waiting Pod stays Pending, unscheduled, its volume unattached.
	wvol := waitingVolume(volOf[waiting])
	r.consistently("Pod "+waiting+" waits unscheduled, "+volOf[waiting]+" without a VolumeAttachment", 4*time.Second, func(ctx context.Context) (string, error) {
		p, ok, err := r.getPod(ctx, waiting)
		switch {
		case err != nil:
			return "", err
		case !ok:
			return "Pod " + waiting + " gone", nil
		case p.Status.Phase != v1.PodPending || p.Spec.NodeName != "":
			return fmt.Sprintf("Pod %s %s on %q", waiting, p.Status.Phase, p.Spec.NodeName), nil
		case condition(p, v1.PodScheduled) != v1.ConditionFalse:
			return fmt.Sprintf("Pod %s PodScheduled %q", waiting, condition(p, v1.PodScheduled)), nil
		}
		vas, err := r.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		for i := range vas.Items {
			if wvol.of(&vas.Items[i]) {
				return "VolumeAttachment " + vas.Items[i].Name + " for " + volOf[waiting], nil
			}
		}
		return "", nil
	})
	e, err := r.podEvent(r.ctx, waiting, "FailedScheduling", maxVolumeCountReason, scheduler)
	if err != nil || e == nil {
		t.Fatalf("FailedScheduling event of %s gone (err %v)", waiting, err)
	}
	t.Logf("%s: %s %q", waiting, e.Reason, e.Message)

	// Free one node: unmount, then detach, then the waiting Pod goes there.
	freed, stays := placed[0], placed[1]
	n := onNode[freed]
	r.deletePod(freed)
	r.waitPodGone(freed, 2*time.Minute)
	r.waitDetached(volOf[freed], n, 2*time.Minute)
	d := r.checkDetach(volOf[freed], n)
	r.waitPodRunning(waiting, 2*time.Minute)
	p, _, err := r.getPod(r.ctx, waiting)
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != n.Name || !podScheduledBy(p, scheduler) {
		t.Fatalf("Pod %s: node %q, scheduler %q, PodScheduled %v; want %s (the freed node) chosen by default-scheduler", waiting, p.Spec.NodeName, p.Spec.SchedulerName, condition(p, v1.PodScheduled), n.Name)
	}
	if e, err := r.podEvent(r.ctx, waiting, "Scheduled", n.Name, scheduler); err != nil || e == nil {
		t.Errorf("no Scheduled event from default-scheduler naming %s on Pod %s (err %v)", n.Name, waiting, err)
	}
	t.Logf("%s scheduled to %s and Running after %s", waiting, n.Name, time.Since(start).Round(time.Millisecond))
	bound := r.hist.mustFirst(t, "Pod "+waiting+" bound to a node", podNamed(waiting, func(p *v1.Pod) bool { return p.Spec.NodeName != "" }))
	if bound.RV < d.gone.RV {
		t.Errorf("Pod %s bound to %s (%s) before VolumeAttachment of %s was gone (%s): the scheduler did not count it", waiting, n.Name, bound, volOf[freed], d.gone)
	}
	t.Logf("%s bound to %s at RV %d, after %s's VolumeAttachment there was gone (RV %d)", waiting, n.Name, bound.RV, volOf[freed], d.gone.RV)
	firstVA := r.hist.mustFirst(t, "a VolumeAttachment of "+volOf[waiting], wvol.change)
	if firstVA.RV < bound.RV {
		t.Errorf("VolumeAttachment of %s for Pod %s written (%s) before the Pod was bound (%s)", volOf[waiting], waiting, firstVA, bound)
	}
	r.checkAttach(volOf[waiting], n, waiting)
	calls := r.s.Driver.Calls()
	for _, c := range calls {
		if c.Method == "ControllerPublishVolume" && c.Done() && c.Code == codes.ResourceExhausted {
			t.Errorf("the driver refused ControllerPublish #%d of %s to %s (%s): a Pod was placed over the node's limit", c.ID, c.VolumeID, c.NodeID, c.Message)
		}
	}

	// Take the rest down, each detach after its unmount.
	r.deletePod(stays)
	r.deletePod(waiting)
	r.waitDetached(volOf[stays], onNode[stays], 2*time.Minute)
	r.waitDetached(volOf[waiting], n, 2*time.Minute)
	r.checkDetach(volOf[stays], onNode[stays])
	r.checkDetach(volOf[waiting], n)
	t.Logf("every volume detached after %s", time.Since(start).Round(time.Millisecond))
}

// newSchedulerRig is newRig with the real kube-scheduler and
// kube-controller-manager (rigOptions.ControlPlane).
func newSchedulerRig(t *testing.T, timeout time.Duration) *rig {
	t.Helper()
	return newRig(t, timeout, rigOptions{Mock: slowPublishAndUnstage, ControlPlane: true})
}

// unscheduledPod creates Pod name mounting the PVCs of vols with no
// spec.nodeName: the scheduler places it.
func (r *rig) unscheduledPod(name string, vols ...string) {
	r.t.Helper()
	p := localcluster.NewPod(r.ns, name, "", vols...)
	if _, err := r.client.CoreV1().Pods(r.ns).Create(r.ctx, p, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// waitAllocatable waits for n's CSINode to give the driver the
// allocatable count want (NodeGetInfo's max_volumes_per_node).
func (r *rig) waitAllocatable(n *node, want int32) {
	t := r.t
	t.Helper()
	testsupport.Eventually(t, r.ctx, 30*time.Second, fmt.Sprintf("CSINode %s allocatable count %d", n.Name, want), func(ctx context.Context) (bool, error) {
		d, err := r.csiNodeDriver(ctx, n.Name)
		if err != nil || d == nil || d.Allocatable == nil || d.Allocatable.Count == nil {
			return false, err
		}
		if *d.Allocatable.Count != want {
			t.Fatalf("CSINode %s allocatable count %d, want %d (NodeGetInfo's max_volumes_per_node)", n.Name, *d.Allocatable.Count, want)
		}
		return true, nil
	})
}

// podEvent is an event of reason on Pod pod whose message contains msg,
// reported by the component from ("": any); nil when there is none.
func (r *rig) podEvent(ctx context.Context, pod, reason, msg, from string) (*v1.Event, error) {
	evs, err := r.client.CoreV1().Events(r.ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": pod, "reason": reason,
	}.String()})
	if err != nil {
		return nil, err
	}
	for i, e := range evs.Items {
		if (from == "" || e.ReportingController == from || e.Source.Component == from) && strings.Contains(e.Message, msg) {
			return &evs.Items[i], nil
		}
	}
	return nil, nil
}

// waitingVolume matches VolumeAttachments of one PV (the rig's PVs are
// named after their volume), on any node.
type waitingVolume string

func (w waitingVolume) of(va *storagev1.VolumeAttachment) bool {
	return va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == string(w)
}

func (w waitingVolume) change(c change) bool {
	va, ok := c.Obj.(*storagev1.VolumeAttachment)
	return ok && w.of(va)
}

// preboundVolume creates an RWO CSI PV and a PVC named prefix-name (the
// name is the volume handle too), pre-bound to each other as an
// administrator writes them (the PV's claimRef, the PVC's volumeName), and
// waits for kcm's PV controller to complete the binding.
func (r *rig) preboundVolume(name string) string {
	t := r.t
	t.Helper()
	name = r.prefix + "-" + name
	size := resource.MustParse("1Gi")
	rwo := []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes:                   rwo,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: size},
			ClaimRef:                      &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: r.ns, Name: name},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: testDriver, VolumeHandle: name}},
		},
	}
	if _, err := r.client.CoreV1().PersistentVolumes().Create(r.ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      rwo,
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: size}},
			VolumeName:       name,
			StorageClassName: new(""),
		},
	}
	if _, err := r.client.CoreV1().PersistentVolumeClaims(r.ns).Create(r.ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, r.ctx, time.Minute, "PVC "+r.ns+"/"+name+" bound by kcm's PV controller", func(ctx context.Context) (bool, error) {
		c, err := r.client.CoreV1().PersistentVolumeClaims(r.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return c.Status.Phase == v1.ClaimBound && c.Annotations["pv.kubernetes.io/bind-completed"] == "yes", nil
	})
	return name
}
