package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/kube"
)

// Annotation and taint names the kubelet stand-in uses. They mirror the
// names a real kubelet and the node lifecycle use.
const (
	ControllerManagedAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"
	OutOfServiceTaint           = "node.kubernetes.io/out-of-service"
	kubeletFieldManager         = "latch-kubelet-standin"
	podNodeIndex                = "spec.nodeName"
)

// NodeConfig describes a simulated node.
type NodeConfig struct {
	Name string
	// Drivers maps CSI driver name → the node ID the driver reports on this
	// node; each becomes an entry of the node's CSINode. A nil map gives a
	// CSINode without drivers.
	Drivers map[string]string
	// NoCSINode skips creating the CSINode object.
	NoCSINode bool
	// Unmanaged leaves out the controller-managed attach/detach annotation.
	Unmanaged bool
	Labels    map[string]string
}

// Kubelet stands in for the kubelets of simulated nodes: it registers Node
// and CSINode objects and walks Pods bound to its nodes through the volume
// part of their lifecycle, the way the attach/detach controller sees a real
// kubelet do it:
//
//   - a Pod starts (phase Running, Ready) once every attachable volume it
//     uses is listed in the node's status.volumesAttached; its volumes are
//     added to status.volumesInUse first (a kubelet reports a volume in use
//     before it mounts it);
//   - when a Pod is deleted or terminates, its volumes leave volumesInUse
//     (unless another running Pod on the node uses them) and only then is a
//     deleted Pod's object removed (grace period 0), as after an unmount.
//
// It does not run containers, mount anything or talk to the CSI driver.
type Kubelet struct {
	client kubernetes.Interface

	factory informers.SharedInformerFactory
	pods    cache.SharedIndexInformer
	nodes   corelisters.NodeLister
	pvcs    corelisters.PersistentVolumeClaimLister
	pvs     corelisters.PersistentVolumeLister
	csiDrvs storagelisters.CSIDriverLister
	// translator maps migrated in-tree volumes to their CSI driver.
	translator csitrans.CSITranslator
	queue      workqueue.TypedRateLimitingInterface[string]
	mu         sync.Mutex
	managed    sets.Set[string]    // node names this stand-in runs
	started    sets.Set[types.UID] // pods whose volumes were all attached
	startedMu  sync.Mutex
}

// trimForStandIn is the stand-in's informer transform. It reads no managed
// fields, and of a claim only spec.volumeName; at the scale run's sizes
// (docs/scale.md) the stand-in's caches are a large part of the harness's
// memory.
func trimForStandIn(obj any) (any, error) {
	if pvc, ok := obj.(*v1.PersistentVolumeClaim); ok {
		return &v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: pvc.Name, Namespace: pvc.Namespace, UID: pvc.UID, ResourceVersion: pvc.ResourceVersion},
			Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pvc.Spec.VolumeName},
		}, nil
	}
	return kube.StripManagedFields(obj)
}

// NewKubelet returns a stand-in for simulated nodes; call Run to start it.
func NewKubelet(client kubernetes.Interface) *Kubelet {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trimForStandIn))
	k := &Kubelet{
		client:     client,
		factory:    f,
		pods:       f.Core().V1().Pods().Informer(),
		nodes:      f.Core().V1().Nodes().Lister(),
		pvcs:       f.Core().V1().PersistentVolumeClaims().Lister(),
		pvs:        f.Core().V1().PersistentVolumes().Lister(),
		csiDrvs:    f.Storage().V1().CSIDrivers().Lister(),
		translator: csitrans.New(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "kubelet-standin"}),
		managed: sets.New[string](),
		started: sets.New[types.UID](),
	}
	_ = k.pods.AddIndexers(cache.Indexers{podNodeIndex: func(obj any) ([]string, error) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return nil, nil
		}
		return []string{pod.Spec.NodeName}, nil
	}})
	podHandler := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*v1.Pod); ok && pod.Spec.NodeName != "" {
			k.enqueue(pod.Spec.NodeName)
		}
	}
	_, _ = k.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    podHandler,
		UpdateFunc: func(_, obj any) { podHandler(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				k.forgetStarted(pod.UID)
			}
			podHandler(obj)
		},
	})
	nodeHandler := func(obj any) {
		if node, ok := obj.(*v1.Node); ok {
			k.enqueue(node.Name)
		}
	}
	_, _ = f.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    nodeHandler,
		UpdateFunc: func(_, obj any) { nodeHandler(obj) },
	})
	// A PVC getting bound or a CSIDriver appearing changes which volumes a
	// Pod waits for; re-evaluate every node (the queue dedupes).
	all := func(any) { k.enqueueAll() }
	for _, inf := range []cache.SharedIndexInformer{
		f.Core().V1().PersistentVolumeClaims().Informer(),
		f.Core().V1().PersistentVolumes().Informer(),
		f.Storage().V1().CSIDrivers().Informer(),
	} {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    all,
			UpdateFunc: func(_, obj any) { all(obj) },
			DeleteFunc: all,
		})
	}
	return k
}

func (k *Kubelet) enqueue(node string) {
	k.mu.Lock()
	ok := k.managed.Has(node)
	k.mu.Unlock()
	if ok {
		k.queue.Add(node)
	}
}

func (k *Kubelet) enqueueAll() {
	k.mu.Lock()
	names := k.managed.UnsortedList()
	k.mu.Unlock()
	for _, n := range names {
		k.queue.Add(n)
	}
}

// Run starts the informers and the given number of workers and blocks until
// ctx is done.
func (k *Kubelet) Run(ctx context.Context, workers int) {
	defer k.queue.ShutDown()
	k.factory.Start(ctx.Done())
	k.factory.WaitForCacheSync(ctx.Done())
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
	k.factory.Shutdown()
}

func (k *Kubelet) processNext(ctx context.Context) bool {
	node, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(node)
	if err := k.syncNode(ctx, node); err != nil {
		klog.FromContext(ctx).V(4).Info("Kubelet stand-in sync failed, retrying", "node", node, "err", err)
		k.queue.AddRateLimited(node)
		return true
	}
	k.queue.Forget(node)
	return true
}

// AddNode registers a Ready node and its CSINode and starts managing the
// node's Pods. Adopting an existing node (for a restarted stand-in) is fine.
func (k *Kubelet) AddNode(ctx context.Context, cfg NodeConfig) error {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   cfg.Name,
			Labels: map[string]string{"kubernetes.io/hostname": cfg.Name},
		},
		Status: v1.NodeStatus{
			Conditions: []v1.NodeCondition{readyCondition(v1.ConditionTrue, time.Now())},
		},
	}
	for key, v := range cfg.Labels {
		node.Labels[key] = v
	}
	if !cfg.Unmanaged {
		node.Annotations = map[string]string{ControllerManagedAnnotation: "true"}
	}
	created, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{FieldManager: kubeletFieldManager})
	switch {
	case apierrors.IsAlreadyExists(err):
		created, err = k.client.CoreV1().Nodes().Get(ctx, cfg.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("adopt node %s: %w", cfg.Name, err)
		}
	case err != nil:
		return fmt.Errorf("register node %s: %w", cfg.Name, err)
	}
	if !cfg.NoCSINode {
		csiNode := &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{
				Name: cfg.Name,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: created.Name, UID: created.UID,
				}},
			},
		}
		for _, driver := range slices.Sorted(maps.Keys(cfg.Drivers)) {
			csiNode.Spec.Drivers = append(csiNode.Spec.Drivers, storagev1.CSINodeDriver{Name: driver, NodeID: cfg.Drivers[driver]})
		}
		_, err := k.client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{FieldManager: kubeletFieldManager})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("register CSINode %s: %w", cfg.Name, err)
		}
	}
	k.mu.Lock()
	k.managed.Insert(cfg.Name)
	k.mu.Unlock()
	k.queue.Add(cfg.Name)
	return nil
}

// SetReady sets the node's Ready condition.
func (k *Kubelet) SetReady(ctx context.Context, name string, ready bool) error {
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{
		"conditions": []v1.NodeCondition{readyCondition(status, time.Now())},
	}})
	// Node conditions merge by type under strategic merge patch.
	_, err := k.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: kubeletFieldManager}, "status")
	if err != nil {
		return fmt.Errorf("set node %s ready=%v: %w", name, ready, err)
	}
	return nil
}

// Taint adds a taint to the node (replacing one with the same key).
func (k *Kubelet) Taint(ctx context.Context, name string, taint v1.Taint) error {
	node, err := k.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("taint node %s: %w", name, err)
	}
	node = node.DeepCopy()
	node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t v1.Taint) bool { return t.Key == taint.Key })
	node.Spec.Taints = append(node.Spec.Taints, taint)
	if _, err := k.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{FieldManager: kubeletFieldManager}); err != nil {
		return fmt.Errorf("taint node %s: %w", name, err)
	}
	return nil
}

// DeleteNode stops managing the node and deletes its Node and CSINode
// objects (nothing garbage-collects the CSINode in a local cluster).
func (k *Kubelet) DeleteNode(ctx context.Context, name string) error {
	k.mu.Lock()
	k.managed.Delete(name)
	k.mu.Unlock()
	if err := k.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete node %s: %w", name, err)
	}
	if err := k.client.StorageV1().CSINodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete CSINode %s: %w", name, err)
	}
	return nil
}

func readyCondition(status v1.ConditionStatus, now time.Time) v1.NodeCondition {
	reason := "KubeletReady"
	if status != v1.ConditionTrue {
		reason = "KubeletNotReady"
	}
	return v1.NodeCondition{
		Type: v1.NodeReady, Status: status, Reason: reason,
		LastHeartbeatTime:  metav1.NewTime(now),
		LastTransitionTime: metav1.NewTime(now),
	}
}
