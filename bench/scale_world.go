package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
)

// scaleWorld is the run's objects: Nodes with CSINodes (registered by the
// kubelet stand-in), and per volume i a bound PVC/PV pair, a Pod on node
// i%nodes, a VolumeAttachment marked attached (with the attacher's
// finalizers, as the attacher leaves them) and the volume in the node's
// status.volumesAttached; the mock driver has every volume published.
// Volumes past sz.Volumes are the "created at start" ones.
type scaleWorld struct {
	prefix, driver, ns, label string
	nodes, volumes            int
	driverMock                *csimock.Driver
	socket                    string
	tmp                       string
	kubelet                   *localcluster.Kubelet
	kubeletWrites             *writeCounter
	stopKubelet               context.CancelFunc
	kubeletDone               chan struct{}
	client                    kubernetes.Interface
	creators                  int

	// The recovery burst's nodes (failSet) are run by a stand-in of their
	// own, stopped when the first burst fails them (a dead kubelet
	// reports nothing): failK nodes for latch's burst, the failK before
	// them for kube-controller-manager's.
	failK           int
	failing         *localcluster.Kubelet
	stopFailingOnce sync.Once
	stopFailing     context.CancelFunc
	failingDone     chan struct{}
	// moved are the volumes a recovery burst moved: volume index → node.
	moved map[int]string
	// extra hands out volume indexes past the start-time ones (trickle
	// and replacement volumes).
	extra atomic.Int64
}

// nodeName is node n's name.
func (w *scaleWorld) nodeName(n int) string { return fmt.Sprintf("%s-n%05d", w.prefix, n) }

// failSet is the nodes a recovery burst fails: the last failK for
// latch ("latch"), the failK before them for kube-controller-manager.
func (w *scaleWorld) failSet(which string) (lo, hi int) {
	hi = w.nodes
	if which == "kcm" {
		hi -= w.failK
	}
	return hi - w.failK, hi
}

// healthyNodes is how many nodes (0 to healthyNodes-1) no burst fails:
// the trickle and the replacement Pods use only them.
func (w *scaleWorld) healthyNodes() int { return w.nodes - 2*w.failK }

// stopFailingKubelet stops the stand-in of the fail sets' nodes.
func (w *scaleWorld) stopFailingKubelet() {
	w.stopFailingOnce.Do(func() {
		if w.stopFailing != nil {
			w.stopFailing()
			<-w.failingDone
		}
	})
}

// node is volume i's node at creation (i mod nodes).
func (w *scaleWorld) node(i int) string { return w.nodeName(i % w.nodes) }
func (w *scaleWorld) pv(i int) string   { return fmt.Sprintf("%s-pv%06d", w.prefix, i) }
func (w *scaleWorld) pod(i int) string  { return fmt.Sprintf("%s-pod%06d", w.prefix, i) }
func (w *scaleWorld) va(i int) string {
	return kubenames.VolumeAttachmentName(w.pv(i), w.driver, w.node(i))
}
func (w *scaleWorld) uniqueName(i int) v1.UniqueVolumeName {
	return kubenames.UniqueVolumeName(w.driver, w.pv(i))
}

var scaleCapability = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// buildWorld creates every object before any component starts and
// reports how long each kind took.
func (e *scaleEnv) buildWorld(ctx context.Context) (*scaleWorld, error) {
	id := e.cfg.RunID
	w := &scaleWorld{
		prefix: "s" + id, driver: "scale-" + id + ".csi.latch.dev", ns: "default", label: "latch-scale=" + id,
		nodes: e.sz.Nodes, volumes: e.sz.Volumes, client: e.client, creators: max(e.sz.Creators, 1),
	}
	var err error
	if w.tmp, err = os.MkdirTemp("", "lsc"); err != nil {
		return w, err
	}
	w.socket = filepath.Join(w.tmp, "csi.sock")
	if w.driverMock, err = stack.MockDriver(ctx, w.driver, w.socket, func(c *csimock.Config) {
		c.CallLogSize = 4 * e.sz.Volumes
	}); err != nil {
		return w, err
	}
	// The kubelet stand-in writes through its own counted client, so its
	// writes are told apart from the components'.
	w.kubeletWrites = newWriteCounter()
	kc, err := kubernetes.NewForConfig(countingConfig(e.rest, w.kubeletWrites, "latch-scale-kubelet"))
	if err != nil {
		return w, err
	}
	w.kubelet = localcluster.NewKubelet(kc)
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.stopKubelet, w.kubeletDone = cancel, make(chan struct{})
	go func() { defer close(w.kubeletDone); w.kubelet.Run(kctx, 4) }()
	// 10% of the nodes per burst, two bursts, and at least one healthy
	// node to move to.
	if w.failK = w.nodes / 10; w.nodes-2*w.failK < 1 {
		w.failK = 0
	}
	w.moved = map[int]string{}
	w.extra.Store(int64(w.volumes + startReserved))
	w.failing = localcluster.NewKubelet(kc)
	fctx, fcancel := context.WithCancel(context.WithoutCancel(ctx))
	w.stopFailing, w.failingDone = fcancel, make(chan struct{})
	go func() { defer close(w.failingDone); w.failing.Run(fctx, 2) }()

	began := time.Now()
	step := func(name string, f func() error) error {
		t := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		e.rep.Figures["create_"+name+"_s"] = round2(time.Since(t).Seconds())
		e.progress("created %-12s in %6.1fs", name, time.Since(t).Seconds())
		return nil
	}
	labels := map[string]string{"latch-scale": id}
	if err := step("nodes", func() error {
		return parallel(ctx, w.nodes, w.creators, func(ctx context.Context, n int) error {
			k := w.kubelet
			if n >= w.healthyNodes() {
				k = w.failing
			}
			return k.AddNode(ctx, localcluster.NodeConfig{Name: w.nodeName(n), Labels: labels,
				Drivers: map[string]string{w.driver: stack.NodeID(w.nodeName(n))}})
		})
	}); err != nil {
		return w, err
	}
	if err := step("volumes", func() error {
		return parallel(ctx, w.volumes, w.creators, func(ctx context.Context, i int) error { return w.createVolume(ctx, i, true) })
	}); err != nil {
		return w, err
	}
	if err := step("node_status", func() error {
		return parallel(ctx, w.nodes, w.creators, func(ctx context.Context, n int) error { return w.patchAttached(ctx, n) })
	}); err != nil {
		return w, err
	}
	if err := step("pods", func() error {
		return parallel(ctx, w.volumes, w.creators, func(ctx context.Context, i int) error { return w.createPod(ctx, i) })
	}); err != nil {
		return w, err
	}
	if err := step("pods_running", func() error { return w.waitPodsRunning(ctx, 30*time.Minute) }); err != nil {
		return w, err
	}
	total := time.Since(began).Seconds()
	e.rep.Figures["create_total_s"] = round2(total)
	e.rep.Figures["harness_writes"] = e.writes.snapshot().Total()
	e.progress("objects ready in %.1fs (%d harness writes, %d creators, protobuf)", total, e.writes.snapshot().Total(), w.creators)
	return w, nil
}

// createVolume creates volume i's PVC (bound), PV (claimed) and, when
// attached, its VolumeAttachment marked attached and the driver's
// publication.
func (w *scaleWorld) createVolume(ctx context.Context, i int, attached bool) error {
	labels := map[string]string{"latch-scale": w.prefix[1:]}
	empty := ""
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: w.pv(i), Namespace: w.ns, Labels: labels},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:       w.pv(i),
			StorageClassName: &empty,
		},
	}
	created, err := w.client.CoreV1().PersistentVolumeClaims(w.ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: pvc.Spec.AccessModes,
		Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}}
	if _, err := w.client.CoreV1().PersistentVolumeClaims(w.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	pv := newPV(w.pv(i), w.driver)
	pv.Labels = labels
	pv.Spec.ClaimRef = &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: w.ns, Name: created.Name, UID: created.UID}
	if attached {
		pv.Finalizers = []string{kubenames.PVFinalizer(w.driver)}
	}
	if _, err := w.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return err
	}
	if !attached {
		return nil
	}
	if err := w.driverMock.SeedVolume(csimock.VolumeSpec{ID: w.pv(i), CapacityBytes: 1 << 30}); err != nil {
		return err
	}
	pc, err := w.driverMock.SeedPublication(w.pv(i), stack.NodeID(w.node(i)), false, scaleCapability)
	if err != nil {
		return err
	}
	va := newVA(w.va(i), w.driver, w.pv(i), w.node(i))
	va.Labels = labels
	va.Finalizers = []string{kubenames.AttacherFinalizer(w.driver)}
	// As csi-attacher leaves an attached VA (a failover, not the first
	// start after the swap from upstream's external-attacher, which adds
	// the volume-handle annotation to every VA once: docs/scale.md).
	va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: stack.NodeID(w.node(i)), decide.AnnVolumeHandle: w.pv(i)}
	cva, err := w.client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	cva.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: pc}
	_, err = w.client.StorageV1().VolumeAttachments().UpdateStatus(ctx, cva, metav1.UpdateOptions{})
	return err
}

// patchAttached lists node n's volumes in its status.volumesAttached.
func (w *scaleWorld) patchAttached(ctx context.Context, n int) error {
	var attached []v1.AttachedVolume
	for i := n; i < w.volumes; i += w.nodes {
		attached = append(attached, v1.AttachedVolume{Name: w.uniqueName(i)})
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesAttached": attached}})
	_, err := w.client.CoreV1().Nodes().Patch(ctx, w.nodeName(n), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func (w *scaleWorld) createPod(ctx context.Context, i int) error {
	return w.createPodOn(ctx, w.pod(i), w.pv(i), w.node(i))
}

// createPodOn creates Pod name on node using claim.
func (w *scaleWorld) createPodOn(ctx context.Context, name, claim, node string) error {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Labels: map[string]string{"latch-scale": w.prefix[1:]}},
		Spec: v1.PodSpec{
			NodeName:   node,
			Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			Volumes: []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{
				PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	_, err := w.client.CoreV1().Pods(w.ns).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// waitPodsRunning waits until the kubelet stand-in runs every Pod of the
// run (their volumes are attached, so it starts them at once).
func (w *scaleWorld) waitPodsRunning(ctx context.Context, timeout time.Duration) error {
	sel := metav1.ListOptions{LabelSelector: w.label, FieldSelector: "status.phase!=Running", Limit: 1}
	return wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := w.client.CoreV1().Pods(w.ns).List(ctx, sel)
		if err != nil {
			return false, err
		}
		return len(l.Items) == 0, nil
	})
}

// cleanup deletes the run's objects (finalizers first) and stops the
// stand-in and the driver.
func (w *scaleWorld) cleanup(ctx context.Context) error {
	if w.stopKubelet != nil {
		w.stopKubelet()
		<-w.kubeletDone
	}
	w.stopFailingKubelet()
	defer func() {
		if w.driverMock != nil {
			w.driverMock.Stop()
		}
		os.RemoveAll(w.tmp)
	}()
	sel := metav1.ListOptions{LabelSelector: w.label}
	zero := int64(0)
	c := w.client
	if err := c.CoreV1().Pods(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, sel); err != nil {
		return err
	}
	if err := c.CoreV1().PersistentVolumeClaims(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return err
	}
	vas, err := c.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var ours []string
	for _, va := range vas.Items {
		if va.Spec.Attacher == w.driver {
			ours = append(ours, va.Name)
		}
	}
	unfinalize := []byte(`{"metadata":{"finalizers":null}}`)
	if err := parallel(ctx, len(ours), w.creators, func(ctx context.Context, i int) error {
		if _, err := c.StorageV1().VolumeAttachments().Patch(ctx, ours[i], types.MergePatchType, unfinalize, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
			return err
		}
		return ignoreNotFound(c.StorageV1().VolumeAttachments().Delete(ctx, ours[i], metav1.DeleteOptions{}))
	}); err != nil {
		return err
	}
	pvs, err := c.CoreV1().PersistentVolumes().List(ctx, sel)
	if err != nil {
		return err
	}
	if err := parallel(ctx, len(pvs.Items), w.creators, func(ctx context.Context, i int) error {
		name := pvs.Items[i].Name
		if _, err := c.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, unfinalize, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
			return err
		}
		return ignoreNotFound(c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}))
	}); err != nil {
		return err
	}
	return parallel(ctx, w.nodes, w.creators, func(ctx context.Context, n int) error {
		if err := ignoreNotFound(c.CoreV1().Nodes().Delete(ctx, w.nodeName(n), metav1.DeleteOptions{})); err != nil {
			return err
		}
		return ignoreNotFound(c.StorageV1().CSINodes().Delete(ctx, w.nodeName(n), metav1.DeleteOptions{}))
	})
}
