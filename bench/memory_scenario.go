package bench

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// runAttacherMemory is scenario C: the attacher's memory with many objects of its
// own and many more it must ignore.
func runAttacherMemory(ctx context.Context, e *env, res *Result) error {
	sz := e.cfg.Sizes
	prefix, driver := e.names(ScenarioAttacherMemory)
	other := prefix + "-other.bench.latch.dev"
	r := &attachRig{e: e, prefix: prefix, driver: driver, nodes: sz.MemoryNodes}
	defer r.close()
	// C's figures are for the objects it creates, not for what the
	// scenarios before it left in the cluster.
	cleared, err := e.clearStorage(ctx)
	if err != nil {
		return fmt.Errorf("remove the earlier scenarios' objects: %w", err)
	}
	res.Figures["cleared_objects"] = float64(cleared)
	setup := time.Now()
	if err := e.createCSINodes(ctx, sz.MemoryNodes, driver, r.node, true); err != nil {
		return fmt.Errorf("create nodes: %w", err)
	}
	if err := e.createPVs(ctx, sz.MemoryForeignPVs, other, func(i int) string { return fmt.Sprintf("%s-other-%06d", prefix, i) }); err != nil {
		return fmt.Errorf("create other driver's PVs: %w", err)
	}
	if err := e.createPVs(ctx, sz.MemoryOurVolumes, driver, r.pv); err != nil {
		return fmt.Errorf("create PVs: %w", err)
	}
	idx := span(sz.MemoryOurVolumes, 0)
	if _, err := r.createVAs(ctx, idx, createConcurrency); err != nil {
		return err
	}
	res.Figures["setup_s"] = round2(time.Since(setup).Seconds())

	if err := r.start(ctx); err != nil {
		return err
	}
	comps := r.comps()
	s0, err := e.snap(ctx, comps, r.d)
	if err != nil {
		return err
	}
	waitErr := waitFor(ctx, sz.AttachTimeout, "every VolumeAttachment attached", r.allAttached(idx))
	// Let the attacher settle (and a last GC report its live heap).
	time.Sleep(2 * time.Second)
	s1, err := e.snapEnd(ctx, comps, r.d)
	if err != nil {
		return err
	}
	lat, last := r.attachedLatencies(idx, make([]time.Time, len(idx)))
	// The rig's driver started with the attacher (r.start): every publish
	// it saw is this phase's, also those made before s0 was read, which
	// on a loaded machine can be several.
	p := &Phase{Name: "sync+attach", Ops: sz.MemoryOurVolumes, CSICalls: int(s1.publishes)}
	p.WallSeconds = last.Sub(s0.at).Seconds()
	p.PerSecond = float64(len(lat)) / p.WallSeconds
	p.setWrites(componentWrites(s0, s1), sz.MemoryOurVolumes)
	e.fillUsage(p, s0, s1)
	res.Phases = append(res.Phases, p)

	cached, err := e.countCached(ctx)
	if err != nil {
		return err
	}
	res.Figures["cached_objects"] = float64(cached)
	live := r.att.Usage()
	res.check("VolumeAttachments attached", fmt.Sprint(sz.MemoryOurVolumes), fmt.Sprint(len(lat)), len(lat) == sz.MemoryOurVolumes, true)
	res.check("ControllerPublish calls", fmt.Sprintf("= %d", sz.MemoryOurVolumes), fmt.Sprint(p.CSICalls), p.CSICalls == sz.MemoryOurVolumes, true)
	if waitErr != nil {
		return waitErr
	}
	if err := finalUsage(e, res, comps); err != nil {
		return err
	}
	if e.cfg.Launcher.Measured() {
		final := r.att.Usage()
		peak := float64(max(final.PeakRSSBytes, live.PeakRSSBytes)) / (1 << 20)
		res.Figures["live_heap_mb"] = round2(float64(live.LiveHeapBytes) / (1 << 20))
		if live.LiveHeapBytes > 0 && cached > 0 {
			res.Figures["heap_bytes_per_cached_object"] = float64(live.LiveHeapBytes / uint64(cached))
		}
		res.check("attacher peak RSS", "≤ 120 MB", fmt.Sprintf("%.0f MB", peak), peak <= 120, false)
	}
	return nil
}

// clusterKind is a cluster-scoped kind the scenarios create: how to list
// it (uncounted) and where to send writes to it (counted as the harness's).
type clusterKind struct {
	resource string
	writes   rest.Interface
	list     func(context.Context, metav1.ListOptions) (runtime.Object, error)
}

// cachedKinds are what a csi-attacher caches; clusterKinds adds Nodes.
func (e *env) cachedKinds() []clusterKind {
	storage, core := e.client.StorageV1().RESTClient(), e.client.CoreV1().RESTClient()
	return []clusterKind{
		{"volumeattachments", storage, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return e.admin.StorageV1().VolumeAttachments().List(ctx, o)
		}},
		{"persistentvolumes", core, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return e.admin.CoreV1().PersistentVolumes().List(ctx, o)
		}},
		{"csinodes", storage, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return e.admin.StorageV1().CSINodes().List(ctx, o)
		}},
	}
}

func (e *env) clusterKinds() []clusterKind {
	return append(e.cachedKinds(), clusterKind{"nodes", e.client.CoreV1().RESTClient(), func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return e.admin.CoreV1().Nodes().List(ctx, o)
	}})
}

// clusterObject is one listed object of a clusterKind.
type clusterObject struct {
	kind clusterKind
	meta metav1.Object
}

// listAll lists every object of kinds from the API server's cache.
func listAll(ctx context.Context, kinds []clusterKind) ([]clusterObject, error) {
	var objs []clusterObject
	for _, k := range kinds {
		list, err := k.list(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", k.resource, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			m, err := meta.Accessor(item)
			if err != nil {
				return nil, err
			}
			objs = append(objs, clusterObject{k, m})
		}
	}
	return objs, nil
}

// clearStorage deletes every VolumeAttachment, PersistentVolume, CSINode
// and Node in the cluster, taking off the finalizers the (by now stopped)
// attachers of earlier scenarios left on them, and returns how many objects
// it deleted.
func (e *env) clearStorage(ctx context.Context) (int, error) {
	objs, err := listAll(ctx, e.clusterKinds())
	if err != nil {
		return 0, err
	}
	err = parallel(ctx, len(objs), createConcurrency, func(ctx context.Context, i int) error {
		k, name := objs[i].kind, objs[i].meta.GetName()
		if len(objs[i].meta.GetFinalizers()) > 0 {
			err := k.writes.Patch(types.MergePatchType).Resource(k.resource).Name(name).Body(noFinalizers).Do(ctx).Error()
			if err := ignoreNotFound(err); err != nil {
				return fmt.Errorf("remove the finalizers of %s %s: %w", k.resource, name, err)
			}
		}
		if err := ignoreNotFound(k.writes.Delete().Resource(k.resource).Name(name).Do(ctx).Error()); err != nil {
			return fmt.Errorf("delete %s %s: %w", k.resource, name, err)
		}
		return nil
	})
	return len(objs), err
}

// countCached counts the objects a csi-attacher caches: every
// VolumeAttachment, PersistentVolume and CSINode.
func (e *env) countCached(ctx context.Context) (int, error) {
	objs, err := listAll(ctx, e.cachedKinds())
	return len(objs), err
}
