package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// podRig is scenario D's and E's world: simulated nodes run by the kubelet
// stand-in, bound PVC/PV pairs, the mock driver, csi-attacher and
// attachdetach-controller.
type podRig struct {
	e           *env
	prefix      string
	driver      string
	nodes       int
	perPod      int
	d           *csimock.Driver
	stopDrv     func()
	comps       map[string]Component
	tracker     *vaTracker
	kubeWrites  *writeCounter
	stopKubelet context.CancelFunc
	// creators is how many Pod creates (and deletes) the harness keeps in
	// flight during the measured burst.
	creators int

	mu      sync.Mutex
	running map[string]time.Time // Pod name → first seen Running
}

func (r *podRig) vol(i int) string      { return fmt.Sprintf("%s-vol-%05d", r.prefix, i) }
func (r *podRig) nodeName(i int) string { return fmt.Sprintf("%s-node-%03d", r.prefix, i%r.nodes) }
func (r *podRig) pod(i int) string      { return fmt.Sprintf("%s-pod-%05d", r.prefix, i) }

// vaName is the VolumeAttachment of Pod i's k-th volume.
func (r *podRig) vaName(pod, k int) string {
	return kubenames.VolumeAttachmentName(r.vol(pod*r.perPod+k), r.driver, r.nodeName(pod))
}

// newPodRig prepares pods*perPod volumes (plus one canary Pod's) on nodes
// nodes and starts everything; the canary Pod is Running when it returns.
func (e *env) newPodRig(ctx context.Context, scenario string, pods, perPod, nodes int) (_ *podRig, err error) {
	r := &podRig{e: e, nodes: nodes, perPod: perPod, comps: map[string]Component{}, running: map[string]time.Time{}, kubeWrites: newWriteCounter(), creators: createConcurrency}
	r.prefix, r.driver = e.names(scenario)
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if err := localcluster.CreateNamespace(ctx, e.client, r.prefix); err != nil {
		return nil, err
	}
	kcfg := countingConfig(e.cfg.Cluster.RESTConfig(), r.kubeWrites, "latch-bench-kubelet")
	kclient, err := kubernetes.NewForConfig(kcfg)
	if err != nil {
		return nil, err
	}
	kubelet := localcluster.NewKubelet(kclient)
	kctx, cancel := context.WithCancel(ctx)
	r.stopKubelet = cancel
	go kubelet.Run(kctx, 8)
	for i := range nodes {
		if err := kubelet.AddNode(ctx, localcluster.NodeConfig{Name: r.nodeName(i), Drivers: map[string]string{r.driver: r.nodeName(i) + "-id"}}); err != nil {
			return nil, err
		}
	}
	// Volume index pods*perPod is the canary's.
	if err := parallel(ctx, pods*perPod+1, createConcurrency/4, func(ctx context.Context, i int) error {
		_, _, err := localcluster.CreateBoundVolume(ctx, e.client, localcluster.VolumeSpec{Namespace: r.prefix, Name: r.vol(i), Driver: r.driver})
		return err
	}); err != nil {
		return nil, fmt.Errorf("create volumes: %w", err)
	}
	if err := r.trackPods(ctx); err != nil {
		return nil, err
	}
	d, addr, stop, err := e.startDriver(ctx, r.driver)
	if err != nil {
		return nil, err
	}
	r.d, r.stopDrv = d, stop
	if r.tracker, err = e.trackVAs(ctx, r.driver); err != nil {
		return nil, err
	}
	if r.comps["csi-attacher"], err = e.cfg.Launcher.StartAttacher(ctx, addr); err != nil {
		return nil, err
	}
	if r.comps["attachdetach-controller"], err = e.cfg.Launcher.StartController(ctx); err != nil {
		return nil, err
	}
	canary := localcluster.NewPod(r.prefix, r.prefix+"-canary", r.nodeName(0), r.vol(pods*perPod))
	if _, err := e.client.CoreV1().Pods(r.prefix).Create(ctx, canary, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 2*time.Minute, "the canary Pod Running", func() bool { return r.isRunning(canary.Name) }); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *podRig) trackPods(ctx context.Context) error {
	lw := cache.NewListWatchFromClient(r.e.admin.CoreV1().RESTClient(), "pods", r.prefix, fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &v1.Pod{}, 0, cache.Indexers{})
	_ = inf.SetTransform(kube.StripManagedFields)
	observe := func(obj any) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Status.Phase != v1.PodRunning {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, seen := r.running[pod.Name]; !seen {
			r.running[pod.Name] = time.Now()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }}); err != nil {
		return err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("the Pod watch did not sync: %w", ctx.Err())
	}
	return nil
}

func (r *podRig) isRunning(pod string) bool {
	_, ok := r.runningAt(pod)
	return ok
}

func (r *podRig) runningAt(pod string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.running[pod]
	return at, ok
}

func (r *podRig) close() {
	for _, c := range r.comps {
		if c != nil {
			_ = c.Stop()
		}
	}
	if r.stopKubelet != nil {
		r.stopKubelet()
	}
	if r.stopDrv != nil {
		r.stopDrv()
	}
}

// createPods creates Pods idx, each with its perPod volumes, with
// r.creators calls in flight, and returns when each create returned.
func (r *podRig) createPods(ctx context.Context, idx []int) ([]time.Time, error) {
	created := make([]time.Time, len(idx))
	err := parallel(ctx, len(idx), r.creators, func(ctx context.Context, j int) error {
		i := idx[j]
		claims := make([]string, r.perPod)
		for k := range claims {
			claims[k] = r.vol(i*r.perPod + k)
		}
		_, err := r.e.client.CoreV1().Pods(r.prefix).Create(ctx, localcluster.NewPod(r.prefix, r.pod(i), r.nodeName(i), claims...), metav1.CreateOptions{})
		created[j] = time.Now()
		return err
	})
	return created, err
}

func (r *podRig) deletePods(ctx context.Context, idx []int) error {
	return parallel(ctx, len(idx), r.creators, func(ctx context.Context, j int) error {
		return ignoreNotFound(r.e.client.CoreV1().Pods(r.prefix).Delete(ctx, r.pod(idx[j]), metav1.DeleteOptions{}))
	})
}

func (r *podRig) allRunning(idx []int) func() bool {
	return func() bool {
		for _, i := range idx {
			if !r.isRunning(r.pod(i)) {
				return false
			}
		}
		return true
	}
}

// allVAsGone holds once only the canary's VolumeAttachment is left.
func (r *podRig) allVAsGone() bool {
	exist, _ := r.tracker.counts()
	return exist <= 1
}

// attachFigures returns, for Pods idx created at created, Pod created →
// all its volumes attached, Pod created → Running, and the last time any
// volume was attached.
func (r *podRig) attachFigures(idx []int, created []time.Time) (attached, running []time.Duration, last time.Time) {
	for j, i := range idx {
		var all time.Time
		ok := true
		for k := range r.perPod {
			at, seen := r.tracker.attachedAt(r.vaName(i, k))
			if !seen {
				ok = false
				break
			}
			if at.After(all) {
				all = at
			}
		}
		if ok {
			attached = append(attached, all.Sub(created[j]))
			if all.After(last) {
				last = all
			}
		}
		if at, seen := r.runningAt(r.pod(i)); seen {
			running = append(running, at.Sub(created[j]))
		}
	}
	return attached, running, last
}

// stageFigures splits Pod created → attached at the moment the harness
// first saw each VolumeAttachment: before it the attachdetach-controller
// works (Pod watch, VA create), after it the csi-attacher (finalizers,
// ControllerPublish, status). Both ends are seen through the same watch, so
// its delay falls on both sides alike. Empty when no volume was seen
// attached.
func (r *podRig) stageFigures(idx []int, created []time.Time) map[string]float64 {
	var toVA, toAttached []time.Duration
	for j, i := range idx {
		for k := range r.perPod {
			name := r.vaName(i, k)
			seen, ok1 := r.tracker.seenAt(name)
			at, ok2 := r.tracker.attachedAt(name)
			if !ok1 || !ok2 {
				continue
			}
			toVA = append(toVA, seen.Sub(created[j]))
			toAttached = append(toAttached, at.Sub(seen))
		}
	}
	if len(toVA) == 0 {
		return nil
	}
	f := map[string]float64{"pod_creates_s": round2(spanOf(created).Seconds())}
	f["pod_to_va_p50_ms"], f["pod_to_va_p99_ms"] = percentiles(toVA)
	f["va_to_attached_p50_ms"], f["va_to_attached_p99_ms"] = percentiles(toAttached)
	return f
}
