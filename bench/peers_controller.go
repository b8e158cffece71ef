package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// runPeerController runs one controller contender on the Pod workload:
// simulated nodes (the kubelet stand-in), bound PVC/PV pairs, latch's
// csi-attacher in this process (the same for every controller contender,
// its writes counted apart), Pods with one volume each created at once,
// then deleted at once. It measures Pod created → its volume in the
// node's status.volumesAttached and Pod deleted → VolumeAttachment gone,
// the controller's CPU, peak RSS and writes per Pod.
func runPeerController(ctx context.Context, e *env, cfg *PeersConfig, c PeerController, run *PeerRun, scenario string) error {
	sz := cfg.Sizes
	procs := cfg.processes()
	attWrites := newWriteCounter()
	e.cfg.Launcher = &peerLauncher{
		attacher: func(ctx context.Context, addr string) (Component, error) {
			acfg := stack.AttacherConfig(countingConfig(rest.CopyConfig(cfg.Cluster.RESTConfig()), attWrites, "latch-bench-peers-attacher"), addr)
			return goroutine{stack.Attacher(ctx, "csi-attacher", acfg)}, nil
		},
		controller: func(ctx context.Context) (Component, error) {
			if !c.KCM {
				return procs.start(ctx, "attachdetach-controller-"+slug(c.Name), c.Binary, controllerArgs(cfg.Kubeconfig, c.Args)...)
			}
			addr, err := testsupport.FreeLoopbackAddr()
			if err != nil {
				return nil, err
			}
			certs, err := os.MkdirTemp(cfg.LogDir, "kcm-certs")
			if err != nil {
				return nil, err
			}
			args := stack.KubeControllerManagerArgs(stack.KubeControllerManagerConfig{
				Kubeconfig: cfg.Kubeconfig, SecureAddr: addr, CertDir: certs, Args: c.Args,
			})
			return procs.start(ctx, "kube-controller-manager", c.Binary, args...)
		},
	}
	r, err := e.newPodRig(ctx, scenario, sz.Pods, 1, sz.PodNodes)
	if err != nil {
		return err
	}
	defer func() {
		r.close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err := errors.Join(e.clearPods(cctx, r.prefix), e.clearDriverObjects(cctx, r.driver, r.prefix))
		if err != nil && run.Error == "" {
			run.Error = "clean up: " + err.Error()
		}
	}()
	r.creators = sz.Creators
	listed, err := e.trackNodeStatus(ctx, r.prefix)
	if err != nil {
		return err
	}
	idx := span(sz.Pods, 0)
	unique := func(i int) v1.UniqueVolumeName { return kubenames.UniqueVolumeName(r.driver, r.vol(i)) }
	s0, err := e.snap(ctx, r.comps, r.d)
	if err != nil {
		return err
	}
	k0, a0 := r.kubeWrites.snapshot(), attWrites.snapshot()
	created, err := r.createPods(ctx, idx)
	if err != nil {
		return fmt.Errorf("create Pods: %w", err)
	}
	waitErr := waitFor(ctx, sz.Timeout, "every Pod's volume in its node's status and the Pod Running", func() bool {
		for _, i := range idx {
			if _, ok := listed.at(unique(i)); !ok || !r.isRunning(r.pod(i)) {
				return false
			}
		}
		return true
	})
	var toStatus, toAttached []time.Duration
	running := 0
	for j, i := range idx {
		if at, ok := listed.at(unique(i)); ok {
			toStatus = append(toStatus, at.Sub(created[j]))
		}
		if at, ok := r.tracker.attachedAt(r.vaName(i, 0)); ok {
			toAttached = append(toAttached, at.Sub(created[j]))
		}
		if r.isRunning(r.pod(i)) {
			running++
		}
	}
	run.Figures["pod_to_node_status_p50_ms"], run.Figures["pod_to_node_status_p99_ms"] = percentiles(toStatus)
	run.Figures["pod_to_va_attached_p50_ms"], run.Figures["pod_to_va_attached_p99_ms"] = percentiles(toAttached)
	n := len(idx)
	run.check("Pods' volumes in node status", fmt.Sprint(n), fmt.Sprint(len(toStatus)), len(toStatus) == n)
	run.check("Pods Running", fmt.Sprint(n), fmt.Sprint(running), running == n)
	if waitErr != nil {
		return waitErr
	}

	deleted := make([]time.Time, n)
	err = parallel(ctx, n, r.creators, func(ctx context.Context, j int) error {
		err := r.e.client.CoreV1().Pods(r.prefix).Delete(ctx, r.pod(idx[j]), metav1.DeleteOptions{})
		deleted[j] = time.Now()
		return ignoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("delete Pods: %w", err)
	}
	waitErr = waitFor(ctx, sz.Timeout, "every Pod's VolumeAttachment gone", func() bool {
		for _, i := range idx {
			if _, ok := r.tracker.goneAt(r.vaName(i, 0)); !ok {
				return false
			}
		}
		return true
	})
	var toGone []time.Duration
	for j, i := range idx {
		if at, ok := r.tracker.goneAt(r.vaName(i, 0)); ok {
			toGone = append(toGone, at.Sub(deleted[j]))
		}
	}
	run.Figures["pod_deleted_to_va_gone_p50_ms"], run.Figures["pod_deleted_to_va_gone_p99_ms"] = percentiles(toGone)
	run.check("VolumeAttachments gone after their Pod", fmt.Sprint(n), fmt.Sprint(len(toGone)), len(toGone) == n)
	s1, err := e.snap(ctx, r.comps, r.d)
	if err != nil {
		return err
	}
	own := componentWrites(s0, s1).Sub(r.kubeWrites.snapshot().Sub(k0)).Sub(attWrites.snapshot().Sub(a0))
	run.Figures["controller_writes_per_pod"] = round2(float64(own.Total()) / float64(n))
	run.Writes = own
	u0, u1 := s0.usage["attachdetach-controller"], s1.usage["attachdetach-controller"]
	run.Figures["controller_cpu_s"] = round2(u1.CPUSeconds - u0.CPUSeconds)
	run.Figures["controller_peak_rss_mb"] = round2(float64(u1.PeakRSSBytes) / (1 << 20))
	publishes := s1.publishes - s0.publishes
	run.Figures["publishes_per_va"] = float64(publishes) / float64(n)
	run.check("ControllerPublish calls per VolumeAttachment (latch's csi-attacher)", "1.000", fmt.Sprintf("%.3f", float64(publishes)/float64(n)), publishes == int64(n))
	st := r.d.Stats().Publish
	run.check("no single-node volume on two nodes at once", "0 violations, at most 1 node",
		fmt.Sprintf("%d violations, at most %d node(s)", st.SingleNodeViolationsTotal, st.MaxSingleNodePublishedNodes),
		st.SingleNodeViolationsTotal == 0 && st.MaxSingleNodePublishedNodes <= 1)
	return waitErr
}

// nodeStatusTracker records when each volume was first seen in a node's
// status.volumesAttached.
type nodeStatusTracker struct {
	mu     sync.Mutex
	listed map[v1.UniqueVolumeName]time.Time
}

func (t *nodeStatusTracker) at(name v1.UniqueVolumeName) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.listed[name]
	return at, ok
}

// trackNodeStatus watches the Nodes named with prefix; it stops with ctx.
func (e *env) trackNodeStatus(ctx context.Context, prefix string) (*nodeStatusTracker, error) {
	t := &nodeStatusTracker{listed: map[v1.UniqueVolumeName]time.Time{}}
	lw := cache.NewListWatchFromClient(e.admin.CoreV1().RESTClient(), "nodes", "", fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &v1.Node{}, 0, cache.Indexers{})
	_ = inf.SetTransform(kube.StripManagedFields)
	observe := func(obj any) {
		node, ok := obj.(*v1.Node)
		if !ok || len(node.Name) <= len(prefix) || node.Name[:len(prefix)] != prefix {
			return
		}
		now := time.Now()
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, v := range node.Status.VolumesAttached {
			if _, seen := t.listed[v.Name]; !seen {
				t.listed[v.Name] = now
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }}); err != nil {
		return nil, err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("the Node watch did not sync: %w", ctx.Err())
	}
	return t, nil
}

// clearPods deletes the Pods (at once: no kubelet runs any more) and PVCs
// of namespace ns.
func (e *env) clearPods(ctx context.Context, ns string) error {
	zero := int64(0)
	err := e.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	return errors.Join(err, e.client.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
}
