package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/testsupport/heap"
)

// objCost is one figure of the per-object cost benchmark: the live heap a
// controller keeps per object of a kind.
type objCost struct {
	Component string `json:"component"`
	// Kind is Pod, Node, PVC, PV, VA or CSINode for an informer cache;
	// "state" is the rest of what the running controller keeps (desired
	// and actual state, bookkeeping), and "total" all of it, both per
	// volume, less "fixed": what it holds with no objects at all (bytes,
	// not per object).
	Kind string `json:"kind"`
	// Variant is "transformed" (the cache as the controller fills it: its
	// transforms and indexers), "untransformed" (whole objects, same
	// indexers) or "measured" (state, total and fixed, from the running
	// controller).
	Variant string  `json:"variant"`
	Objects int     `json:"objects"`
	Bytes   float64 `json:"bytes_per_object"`
}

// objCostReport is one run of the benchmark.
type objCostReport struct {
	Nodes   int `json:"nodes"`
	Volumes int `json:"volumes"`
	// APIServer says the objects were created through an API server
	// (false: a fake clientset); BuildS is how long building them took.
	APIServer bool      `json:"objects_from_apiserver"`
	BuildS    float64   `json:"build_s"`
	Costs     []objCost `json:"costs"`
	// Writes counts the API writes and CSI calls each controller made
	// while it was measured: the world is consistent, so anything here is
	// work the figures include.
	Writes map[string]int `json:"writes"`
}

// get returns the bytes per object of component's kind in variant.
func (r *objCostReport) get(component, kind, variant string) (float64, bool) {
	for _, c := range r.Costs {
		if c.Component == component && c.Kind == kind && c.Variant == variant {
			return c.Bytes, true
		}
	}
	return 0, false
}

// objController is one controller as the benchmark starts it.
type objController struct {
	name string
	// start builds the controller on client exactly as its binary does
	// and returns its informers by kind, a function that runs it until
	// ctx is done, whether its queues are empty, how many CSI calls it
	// made, and a function that shuts its informers down.
	start func(ctx context.Context, client kubernetes.Interface, driver string) (*objRun, error)
}

type objRun struct {
	informers map[string]cache.SharedIndexInformer
	// records are the transforms of the caches that hold records of the
	// controller's own instead of API objects (the attachdetach
	// controller's Pods): such a cache is priced by decoding the world's
	// objects and transforming them again.
	records  map[string]cache.TransformFunc
	run      func(ctx context.Context) error
	idle     func() bool
	csiCalls func() int
	shutdown func()
}

// measureObjCosts builds the scale world for nodes and volumes through
// client (nil: a fake clientset; see buildObjWorld) and measures every
// controller on it.
func measureObjCosts(ctx context.Context, client kubernetes.Interface, nodes, volumes int) (*objCostReport, error) {
	began := time.Now()
	w, err := buildObjWorld(ctx, client, nodes, volumes)
	if err != nil {
		return nil, err
	}
	empty, err := buildObjWorld(ctx, nil, 0, 0)
	if err != nil {
		return nil, err
	}
	rep := &objCostReport{Nodes: nodes, Volumes: volumes, APIServer: client != nil, Writes: map[string]int{},
		BuildS: round2(time.Since(began).Seconds())}
	for _, c := range objControllers() {
		if err := measureController(ctx, w, empty, c, rep); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	runtime.KeepAlive(w)
	return rep, nil
}

// measureController runs c over the world until it is idle and records the
// live heap it holds (total, per volume), then rebuilds each of its
// informer caches alone, from what the cache held, to price each kind with
// and without the controller's transforms; what the caches do not account
// for is the controller's own state.
func measureController(ctx context.Context, w, empty *objWorld, c objController, rep *objCostReport) error {
	// What the controller holds with no objects at all is not per object.
	fixed, _, _, err := runController(ctx, empty, c, &objCostReport{Writes: map[string]int{}})
	if err != nil {
		return fmt.Errorf("on no objects: %w", err)
	}
	total, shaped, indexers, err := runController(ctx, w, c, rep)
	if err != nil {
		return err
	}
	total -= fixed
	// The controller is stopped; its goroutines wind down (timers and
	// loops that wake up to notice) and its caches are collected before
	// the caches are priced one by one.
	settleHeap(ctx)
	caches := 0.0
	for _, k := range objKinds {
		if _, ok := indexers[k.kind]; !ok {
			continue
		}
		held := shaped[k.kind]
		if len(held.encoded) != len(w.objects[k.kind]) {
			return fmt.Errorf("its %s cache held %d objects, the world has %d", k.kind, len(held.encoded), len(w.objects[k.kind]))
		}
		with, err := storeBytesPerObject(held.encoded, indexers[k.kind], held.transform)
		if err != nil {
			return fmt.Errorf("%s cache: %w", k.kind, err)
		}
		without, err := storeBytesPerObject(w.objects[k.kind], indexers[k.kind], nil)
		if err != nil {
			return fmt.Errorf("%s cache: %w", k.kind, err)
		}
		n := len(held.encoded)
		rep.Costs = append(rep.Costs,
			objCost{Component: c.name, Kind: k.kind, Variant: "transformed", Objects: n, Bytes: with},
			objCost{Component: c.name, Kind: k.kind, Variant: "untransformed", Objects: n, Bytes: without})
		caches += with * float64(n)
	}
	rep.Costs = append(rep.Costs,
		objCost{Component: c.name, Kind: "fixed", Variant: "measured", Objects: 0, Bytes: fixed},
		objCost{Component: c.name, Kind: "state", Variant: "measured", Objects: w.volumes, Bytes: (total - caches) / float64(w.volumes)},
		objCost{Component: c.name, Kind: "total", Variant: "measured", Objects: w.volumes, Bytes: total / float64(w.volumes)})
	return nil
}

// runController runs c over the world until it is idle and returns the
// live heap it then held, what each of its informer caches held (encoded)
// and the caches' indexers; c is stopped when it returns.
func runController(ctx context.Context, w *objWorld, c objController, rep *objCostReport) (total float64, shaped map[string]shapedObjects, indexers map[string]cache.Indexers, err error) {
	writesBefore := countWrites(w)
	before := heap.Live()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := c.start(rctx, w.client, w.driver)
	if err != nil {
		return 0, nil, nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- r.run(rctx) }()
	defer func() {
		cancel()
		if rerr := <-errc; rerr != nil && err == nil && ctx.Err() == nil {
			err = fmt.Errorf("run: %w", rerr)
		}
		r.shutdown()
	}()
	var synced []cache.InformerSynced
	for _, inf := range r.informers {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(rctx.Done(), synced...) {
		return 0, nil, nil, fmt.Errorf("caches did not sync")
	}
	if err := waitSettled(ctx, w, r.idle); err != nil {
		return 0, nil, nil, err
	}
	total = float64(heap.Live()) - float64(before)
	rep.Writes[c.name+" API writes"] = countWrites(w) - writesBefore
	rep.Writes[c.name+" CSI calls"] = r.csiCalls()

	shaped, indexers = map[string]shapedObjects{}, map[string]cache.Indexers{}
	for kind, inf := range r.informers {
		indexers[kind] = inf.GetIndexer().GetIndexers()
		held := inf.GetStore().List()
		if tr, ok := r.records[kind]; ok {
			if len(held) != len(w.objects[kind]) {
				return 0, nil, nil, fmt.Errorf("its %s cache held %d records, the world has %d objects", kind, len(held), len(w.objects[kind]))
			}
			shaped[kind] = shapedObjects{encoded: w.objects[kind], transform: tr}
			continue
		}
		var s shapedObjects
		for _, obj := range held {
			ro, ok := obj.(k8sruntime.Object)
			if !ok {
				return 0, nil, nil, fmt.Errorf("%s cache holds a %T, not an object", kind, obj)
			}
			b, err := encodeObject(ro)
			if err != nil {
				return 0, nil, nil, err
			}
			s.encoded = append(s.encoded, b)
		}
		shaped[kind] = s
	}
	return total, shaped, indexers, nil
}

// shapedObjects are the objects of a cache as the running controller held
// them: encoded, and for a cache of records the transform that makes each
// decoded object its record.
type shapedObjects struct {
	encoded   [][]byte
	transform cache.TransformFunc
}

// storeBytesPerObject fills a cache like an informer's (client-go's key
// function, the given indexers) with the encoded objects, each decoded as
// an informer decodes it, and returns the live heap it holds per object:
// the median of storeRounds fillings, so that a collection of something
// else in the process (a stopped controller's last goroutines, the test
// binary's API server) during one of them does not count.
func storeBytesPerObject(encoded [][]byte, indexers cache.Indexers, transform cache.TransformFunc) (float64, error) {
	if len(encoded) == 0 {
		return 0, fmt.Errorf("no objects")
	}
	var rounds []float64
	for range storeRounds {
		b, err := fillStore(encoded, indexers, transform)
		if err != nil {
			return 0, err
		}
		rounds = append(rounds, b)
	}
	slices.Sort(rounds)
	return rounds[len(rounds)/2], nil
}

// storeRounds is how many times each cache is filled (the median counts).
var storeRounds = 3

// fillStore: transform (nil: none) makes each decoded object what the
// cache holds, as an informer's transform does; the decoded object it
// replaces is garbage by the time the heap is read.
func fillStore(encoded [][]byte, indexers cache.Indexers, transform cache.TransformFunc) (float64, error) {
	// Kinds with few objects (a tenth as many Nodes as volumes) fill
	// several caches, so that every figure rests on storeMinObjects
	// objects and the heap's noise is as small per object.
	copies := (storeMinObjects + len(encoded) - 1) / len(encoded)
	stores := make([]cache.Indexer, copies)
	before := heap.Live()
	for i := range stores {
		stores[i] = cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, indexers)
		for _, b := range encoded {
			var obj any
			obj, err := decodeObject(b)
			if err != nil {
				return 0, err
			}
			if transform != nil {
				if obj, err = transform(obj); err != nil {
					return 0, err
				}
			}
			if err := stores[i].Add(obj); err != nil {
				return 0, err
			}
		}
	}
	after := heap.Live()
	if got := len(stores[0].ListKeys()); got != len(encoded) {
		return 0, fmt.Errorf("%d objects under %d keys", len(encoded), got)
	}
	return (float64(after) - float64(before)) / float64(copies*len(encoded)), nil
}

// storeMinObjects is how many objects each cache figure is measured over
// at least.
const storeMinObjects = 10000

// waitSettled waits until the controller's queues are empty (when it says)
// and neither its writes nor the live heap (within 0.5 %) have moved for a
// second.
func waitSettled(ctx context.Context, w *objWorld, idle func() bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	lastWrites, lastHeap, quiet := -1, uint64(0), 0
	for quiet < 4 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the controller did not settle in 2 minutes")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		writes, heap := countWrites(w), heap.Live()
		steady := writes == lastWrites && heap < lastHeap+lastHeap/200 && heap+lastHeap/200 > lastHeap
		if steady && (idle == nil || idle()) {
			quiet++
		} else {
			quiet = 0
		}
		lastWrites, lastHeap = writes, heap
	}
	return nil
}

var writeVerbs = []string{"create", "update", "patch", "delete", "delete-collection"}

// countWrites counts the write actions the world's clientset has served.
func countWrites(w *objWorld) int {
	n := 0
	for _, a := range w.client.Actions() {
		if slices.Contains(writeVerbs, a.GetVerb()) {
			n++
		}
	}
	return n
}

// settleHeap waits (at most 10 s) until the live heap stops shrinking or
// growing: three readings 300 ms apart within 32 KiB of each other.
func settleHeap(ctx context.Context) {
	last, steady := heap.Live(), 0
	for deadline := time.Now().Add(10 * time.Second); steady < 3 && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
		h := heap.Live()
		if d := int64(h) - int64(last); d < 32<<10 && d > -32<<10 {
			steady++
		} else {
			steady = 0
		}
		last = h
	}
}

// metricUnit is the figure's unit for testing.B.ReportMetric, e.g.
// attacher-heap-B/VA, attacher-whole-B/VA, adc-state-B/volume,
// adc-fixed-B.
func (c objCost) metricUnit() string {
	comp := map[string]string{"csi-attacher": "attacher", "attachdetach-controller": "adc"}[c.Component]
	switch c.Variant {
	case "transformed":
		return comp + "-heap-B/" + c.Kind
	case "untransformed":
		return comp + "-whole-B/" + c.Kind
	}
	if c.Kind == "fixed" {
		return comp + "-fixed-B"
	}
	return comp + "-" + c.Kind + "-B/volume"
}
