package controller

import (
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/kube"
)

// OtherControllerReason is the reason of the Warning event on the object
// that proves another attach/detach controller writes in the cluster.
const OtherControllerReason = "OtherAttachDetachController"

// DefaultCoexistencePeriod is --coexistence-report-period's default.
const DefaultCoexistencePeriod = 5 * time.Minute

// coexistence is the coexistence guard: it reads the managedFields of
// every Node and VolumeAttachment the informers deliver (in their
// transforms, before kube.StripManagedFields drops them), hands the facts
// to decide.DecideCoexistence and reports what it finds: an error log line
// and a Warning event on the evidence at most once per period, and the
// competing-controllers gauge, 1 while the last evidence is younger than
// period. It never stops the controller (docs/attachdetach-controller.md,
// "Another attach/detach controller").
//
// Transforms run on the informers' goroutines, one object at a time per
// informer, before the handlers; they must not block or call the API
// server: reporting only logs and hands an event to the recorder.
type coexistence struct {
	period   time.Duration
	clock    clock.PassiveClock
	recorder record.EventRecorder
	gauge    *competingGauge
	// nodeManaged says whether a node carries the controller-managed
	// annotation (false for a node not in the cache).
	nodeManaged func(name string) bool

	mu sync.Mutex
	// primed is set once the caches synced: what was transformed before
	// is the initial lists (history).
	primed bool
	// watermark is the latest server timestamp in the initial lists.
	watermark time.Time
	// history is the latest write by another manager in the initial
	// lists, logged once at start.
	history *decide.CoexistEvidence
	// attached is a digest of each node's status.volumesAttached as last
	// seen, to tell a change of the list from any other node write.
	attached map[string]uint64
	// logger is Run's, from prime on; before, nothing is logged (the
	// initial lists only make history), and the zero Logger discards.
	logger klog.Logger
	// reported is when the last error line and event went out.
	reported time.Time
}

func newCoexistence(period time.Duration, clk clock.PassiveClock, recorder record.EventRecorder, gauge *competingGauge, nodeManaged func(string) bool) *coexistence {
	gauge.setPeriod(period, clk)
	return &coexistence{
		period: period, clock: clk, recorder: recorder, gauge: gauge, nodeManaged: nodeManaged,
		attached: map[string]uint64{},
	}
}

// ours are the field managers of this controller's writes.
var ours = []string{kube.AttachDetachFieldManager}

// transformVA and transformNode are the informers' transforms: observe,
// then strip managedFields.
func (c *coexistence) transformVA(obj any) (any, error) {
	if va, ok := obj.(*storagev1.VolumeAttachment); ok && c.period > 0 {
		c.observe(va, decide.CoexistFacts{
			Kind: decide.CoexistVolumeAttachment, Name: va.Name, ManagedFields: va.ManagedFields,
			Created: va.CreationTimestamp.Time,
		}, func() bool { return c.nodeManaged(va.Spec.NodeName) })
	}
	return trimVA(obj)
}

func (c *coexistence) transformNode(obj any) (any, error) {
	if node, ok := obj.(*v1.Node); ok && c.period > 0 {
		digest := attachedDigest(node.Status.VolumesAttached)
		c.mu.Lock()
		prev, seen := c.attached[node.Name]
		c.attached[node.Name] = digest
		c.mu.Unlock()
		c.observe(node, decide.CoexistFacts{
			Kind: decide.CoexistNode, Name: node.Name, ManagedFields: node.ManagedFields,
			VolumesAttachedChanged: seen && prev != digest || !seen && len(node.Status.VolumesAttached) > 0,
		}, nil)
	}
	return trimNode(obj)
}

// nodeGone forgets a deleted node's list.
func (c *coexistence) nodeGone(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.attached, name)
}

// observe completes f (history or not, the watermark, our managers) and
// reports the evidence it holds. nodeManaged is asked only when needed.
func (c *coexistence) observe(obj runtime.Object, f decide.CoexistFacts, nodeManaged func() bool) {
	c.mu.Lock()
	f.Initial, f.Watermark, f.Ours = !c.primed, c.watermark, ours
	if f.Initial {
		c.watermark = decide.CoexistWatermark(c.watermark, f.Created, f.ManagedFields)
		// Record the latest write of another manager, as if it were live,
		// for the start line.
		h := f
		h.Initial, h.Watermark, h.NodeManaged = false, time.Time{}, true
		if ev, ok := decide.DecideCoexistence(h); ok && (c.history == nil || ev.At.After(c.history.At)) {
			c.history = &ev
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if nodeManaged != nil {
		f.NodeManaged = nodeManaged()
	}
	if ev, ok := decide.DecideCoexistence(f); ok {
		c.report(obj, ev)
	}
}

// prime ends the initial lists (the caches synced) and logs what they
// showed.
func (c *coexistence) prime(logger klog.Logger) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.primed, c.logger = true, logger
	if c.period <= 0 {
		logger.Info("Coexistence check disabled (--coexistence-report-period=0)")
		return
	}
	if h := c.history; h != nil {
		// History, not evidence: after the documented swap every object
		// kube-controller-manager wrote still names it.
		logger.Info("Another field manager wrote attach/detach fields before this controller started; only its writes from now on count as another attach/detach controller",
			"manager", h.Manager, "kind", string(h.Kind), "name", h.Name, "field", h.Field, "writtenAt", h.At, "watermark", c.watermark)
	}
}

// report records one piece of evidence: the gauge always, the log line and
// the event once per period.
func (c *coexistence) report(obj runtime.Object, ev decide.CoexistEvidence) {
	now := c.clock.Now()
	c.gauge.detected(now)
	c.mu.Lock()
	if !c.reported.IsZero() && now.Sub(c.reported) < c.period {
		c.mu.Unlock()
		return
	}
	c.reported = now
	logger := c.logger
	c.mu.Unlock()
	what := "created VolumeAttachment"
	if ev.Kind == decide.CoexistNode {
		what = "changed status.volumesAttached of Node"
	}
	logger.Error(nil, "Another attach/detach controller is running in this cluster: turn one off (kube-controller-manager: --controllers=*,-attachdetach)",
		"manager", ev.Manager, "kind", string(ev.Kind), "name", ev.Name, "field", ev.Field, "writtenAt", ev.At, "nextReportAfter", c.period)
	if c.recorder != nil {
		c.recorder.Eventf(obj, v1.EventTypeWarning, OtherControllerReason,
			"Field manager %q %s %s at %s: another attach/detach controller runs beside latch's attachdetach-controller (kube-controller-manager with attachdetach in --controllers?); both create and delete VolumeAttachments. Turn one off.",
			ev.Manager, what, ev.Name, ev.At.UTC().Format(time.RFC3339))
	}
}

// attachedDigest identifies a volumesAttached list (order included: a
// reordered list is a write too).
func attachedDigest(list []v1.AttachedVolume) uint64 {
	h := fnv.New64a()
	for _, av := range list {
		fmt.Fprintf(h, "%s\x00%s\x00", av.Name, av.DevicePath)
	}
	return h.Sum64()
}
