package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
)

// env is what one scenario works with.
type env struct {
	cfg    *Config
	client kubernetes.Interface // the harness's own, counted writes
	writes *writeCounter        // the harness's writes
	admin  kubernetes.Interface // uncounted reads (metrics)
	report *Report
	// limit is what the scenario running compares its rates with: F's,
	// or for A and D the better of the probes around them (limitAround).
	limit limitProbe
	// probed is the probe the last scenario ended with (F's, or one taken
	// after A or D), if any; previous is the one the scenario before the
	// running one ended with, which a judged scenario can use as its
	// probe before when nothing ran in between.
	probed, previous *limitProbe
	probes           int // limit probes so far, for unique object names
}

// createConcurrency is how many creates the harness keeps in flight: enough
// to saturate a loopback API server without queueing for minutes.
const createConcurrency = 48

// parallel runs f(0..n-1) with at most conc calls at once and returns the
// first error.
func parallel(ctx context.Context, n, conc int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}

// startDriver runs a mock CSI driver named name with latency on publish
// and unpublish; it stops with ctx.
func (e *env) startDriver(ctx context.Context, name string) (*csimock.Driver, string, func(), error) {
	dir, err := os.MkdirTemp("", "lb")
	if err != nil {
		return nil, "", nil, err
	}
	socket := filepath.Join(dir, "csi.sock")
	cfg := csimock.DefaultConfig()
	cfg.Name = name
	cfg.NodeService = false
	cfg.AutoCreateVolumes = true
	cfg.CallLogSize = 1 << 20
	d, err := csimock.New(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	if e.cfg.DriverLatency > 0 {
		for _, m := range []string{"ControllerPublishVolume", "ControllerUnpublishVolume"} {
			if _, err := d.AddFault(csimock.Rule{Method: m, Latency: e.cfg.DriverLatency}); err != nil {
				os.RemoveAll(dir)
				return nil, "", nil, err
			}
		}
	}
	if err := d.Start(ctx, socket); err != nil {
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	return d, "unix://" + socket, func() { d.Stop(); os.RemoveAll(dir) }, nil
}

func newPV(name, driver string) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: name, FSType: "ext4",
			}},
		},
	}
}

func newVA(name, driver, pv, node string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
}

// createPVs creates PVs named by name(i) for driver.
func (e *env) createPVs(ctx context.Context, n int, driver string, name func(int) string) error {
	return parallel(ctx, n, createConcurrency, func(ctx context.Context, i int) error {
		_, err := e.client.CoreV1().PersistentVolumes().Create(ctx, newPV(name(i), driver), metav1.CreateOptions{})
		return err
	})
}

// createCSINodes creates n CSINode objects (with Nodes when withNodes) that
// register driver, named node(i), node IDs node(i)+"-id".
func (e *env) createCSINodes(ctx context.Context, n int, driver string, node func(int) string, withNodes bool) error {
	return parallel(ctx, n, createConcurrency, func(ctx context.Context, i int) error {
		name := node(i)
		if withNodes {
			if _, err := e.client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		cn := &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: driver, NodeID: name + "-id"}}},
		}
		_, err := e.client.StorageV1().CSINodes().Create(ctx, cn, metav1.CreateOptions{})
		return err
	})
}

// vaTracker records, from a watch, when each VolumeAttachment of one
// attacher was first seen attached and when it disappeared.
type vaTracker struct {
	driver   string
	informer cache.SharedIndexInformer
	mu       sync.Mutex
	seen     map[string]time.Time // VA name → first seen at all
	attached map[string]time.Time // VA name → first seen attached
	gone     map[string]time.Time
	current  map[string]bool // VA name → attached, for VAs that exist
}

func (e *env) trackVAs(ctx context.Context, driver string) (*vaTracker, error) {
	t := &vaTracker{driver: driver, seen: map[string]time.Time{}, attached: map[string]time.Time{}, gone: map[string]time.Time{}, current: map[string]bool{}}
	lw := cache.NewListWatchFromClient(e.admin.StorageV1().RESTClient(), "volumeattachments", "", fields.Everything())
	t.informer = cache.NewSharedIndexInformer(lw, &storagev1.VolumeAttachment{}, 0, cache.Indexers{})
	_ = t.informer.SetTransform(kube.StripManagedFields)
	observe := func(obj any) {
		va, ok := obj.(*storagev1.VolumeAttachment)
		if !ok || va.Spec.Attacher != driver {
			return
		}
		now := time.Now()
		t.mu.Lock()
		defer t.mu.Unlock()
		t.current[va.Name] = va.Status.Attached
		if _, seen := t.seen[va.Name]; !seen {
			t.seen[va.Name] = now
		}
		if _, seen := t.attached[va.Name]; va.Status.Attached && !seen {
			t.attached[va.Name] = now
		}
	}
	_, err := t.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			va, ok := obj.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Attacher != driver {
				return
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			delete(t.current, va.Name)
			t.gone[va.Name] = time.Now()
		},
	})
	if err != nil {
		return nil, err
	}
	go t.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), t.informer.HasSynced) {
		return nil, fmt.Errorf("VolumeAttachment watch did not sync: %w", ctx.Err())
	}
	return t, nil
}

// counts returns how many tracked VAs exist and how many of them are
// attached.
func (t *vaTracker) counts() (exist, attached int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range t.current {
		exist++
		if a {
			attached++
		}
	}
	return exist, attached
}

func (t *vaTracker) attachedAt(name string) (time.Time, bool) {
	return t.timeOf(t.attached, name)
}

// seenAt returns when the VA named name was first observed.
func (t *vaTracker) seenAt(name string) (time.Time, bool) {
	return t.timeOf(t.seen, name)
}

func (t *vaTracker) goneAt(name string) (time.Time, bool) {
	return t.timeOf(t.gone, name)
}

// timeOf reads the time of name in one of t's maps.
func (t *vaTracker) timeOf(m map[string]time.Time, name string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := m[name]
	return at, ok
}

// waitFor polls cond every 50 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}

// ignoreNotFound drops NotFound errors (deleting what is already gone).
func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
