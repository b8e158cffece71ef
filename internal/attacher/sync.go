package attacher

import (
	"context"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/runner"
)

// The passes: take the VolumeAttachment's name (route), read it, settle
// what an orphan needs, observe, decide, and hand the plan to the
// executor. A pass that finds the object belongs to the other lane says
// so in its answer; the route moves it there.

// syncAttach is one level-based pass of the attach lane for the
// VolumeAttachment name.
func (c *Controller) syncAttach(ctx context.Context, name string) (runner.Result, error) {
	return c.pass(ctx, attachDir, name)
}

// syncDetach is one level-based pass of the detach lane for the
// VolumeAttachment name.
func (c *Controller) syncDetach(ctx context.Context, name string) (runner.Result, error) {
	return c.pass(ctx, detachDir, name)
}

// pass runs one pass of lane for name while it owns name's work: when the
// other lane holds it, the pass returns and the release wakes it. The
// object is read under ownership, so no pass of the other lane can change
// it between the read and the decision.
func (c *Controller) pass(ctx context.Context, lane direction, name string) (runner.Result, error) {
	if !c.route.take(lane, name) {
		return runner.Result{}, nil
	}
	res, next, err := c.sync(ctx, lane, name)
	c.route.release(name, next)
	return res, err
}

// sync is the pass of lane for name; next is the lane the name belongs in
// now when it is not lane (nowhere otherwise).
func (c *Controller) sync(ctx context.Context, lane direction, name string) (res runner.Result, next direction, err error) {
	va, err := c.getVA(name)
	if err != nil {
		return runner.Result{}, nowhere, err
	}
	if lane == detachDir {
		switch {
		case va == nil:
			return runner.Result{}, nowhere, nil
		case va.DeletionTimestamp == nil:
			return runner.Result{}, attachDir, nil
		}
		res, err := c.detachVA(ctx, va)
		return res, nowhere, err
	}
	if va == nil {
		// Gone: only a publication it left behind may need undoing.
		_, res, err := c.settleOrphan(ctx, name, nil)
		return res, nowhere, err
	}
	// A publication left by an earlier VolumeAttachment of this name is
	// undone (or handed over to this one) before this one is worked on.
	if cont, res, err := c.settleOrphan(ctx, name, va); !cont {
		return res, nowhere, err
	}
	if va.DeletionTimestamp != nil {
		return runner.Result{}, detachDir, nil
	}
	res, err = c.attachVA(ctx, va)
	return res, nowhere, err
}

// attachVA decides and runs the attach of va.
func (c *Controller) attachVA(ctx context.Context, va *storagev1.VolumeAttachment) (runner.Result, error) {
	name := va.Name
	// Still pending although settleOrphan let va go on: it waits for va's
	// finalizer (decide.OwnerOnceRecorded).
	pending := c.hasOrphan(name)
	ctx = withVA(ctx, va)
	obs, err := c.observe(va)
	if err != nil {
		return runner.Result{}, err
	}
	plan, published := c.decideAttach(ctx, obs)
	res, err := func() (runner.Result, error) {
		// The outcome is settled before the publish is unregistered: a
		// publication whose VolumeAttachment is gone is an orphan before
		// another pass can miss it (decideAttach).
		defer published()
		plan, secrets, err := c.callFacts(ctx, plan)
		if err != nil {
			return runner.Result{}, err
		}
		return c.afterAttach(ctx, c.exec.runAttach(ctx, va, obs.PV, plan, secrets))
	}()
	if pending && err == nil && c.hasOrphan(name) {
		// Now that va's pass wrote our finalizer, va takes the
		// publication over. Had the write failed, the error's retry would
		// settle the orphan again: kept while va is there, undone once it
		// is gone.
		cur, gerr := c.getVA(name)
		if gerr != nil {
			return res, gerr
		}
		if _, sres, serr := c.settleOrphan(ctx, name, cur); serr != nil {
			return sres, serr
		}
	}
	return res, err
}

// detachVA decides and runs the detach of va, which is being deleted.
func (c *Controller) detachVA(ctx context.Context, va *storagev1.VolumeAttachment) (runner.Result, error) {
	ctx = withVA(ctx, va)
	obs, err := c.observe(va)
	if err != nil {
		return runner.Result{}, err
	}
	obs.StillPublished = c.orphans.isStillPublished(va)
	plan := decide.Detach(obs, c.cfg.Driver, translator(ctx))
	var secrets map[string]string
	if plan.CallsDriver() {
		var facts decide.CallFacts
		if secrets, facts, err = c.exec.readSecret(ctx, plan.Volume.Secret); err != nil {
			return runner.Result{}, err
		}
		plan = decide.DetachWithCallFacts(plan, facts)
	}
	res, err := c.exec.runDetach(ctx, va, plan, secrets)
	if err == nil && obs.StillPublished {
		c.orphans.stillPublishedDone(va)
	}
	return res, err
}

// callFacts reads, when plan calls the driver, what decide.BeforeCall
// judges: the controller-publish secret (its values are returned for the
// calls) and whether the CSI capability can be built. The plan comes back
// with the calls it may not make marked (decide.WithCallFacts). A failed
// read of the secret, other than not found or forbidden, is returned for
// the runner's backoff.
func (c *Controller) callFacts(ctx context.Context, plan decide.AttachPlan) (decide.AttachPlan, map[string]string, error) {
	if !plan.CallsDriver() {
		return plan, nil, nil
	}
	secrets, facts, err := c.exec.readSecret(ctx, plan.Volume.Secret)
	if err != nil {
		return plan, nil, err
	}
	_, facts.CapabilityErr = volumeCapability(c.cfg.Driver, plan.Volume)
	return decide.WithCallFacts(plan, facts), secrets, nil
}

// withVA adds va and its node to ctx's logger.
func withVA(ctx context.Context, va *storagev1.VolumeAttachment) context.Context {
	return klog.NewContext(ctx, klog.FromContext(ctx).WithValues("volumeAttachment", klog.KObj(va), "node", klog.KRef("", va.Spec.NodeName)))
}

// syncPV removes our finalizer from a PV that no longer needs it (see
// releasablePV) once no VolumeAttachment refers to it. The check uses the
// VA informer's PV index, not a scan.
func (c *Controller) syncPV(ctx context.Context, name string) (runner.Result, error) {
	pv, err := c.getPV(name)
	if err != nil || pv == nil {
		return runner.Result{}, err
	}
	if !c.releasablePV(pv) {
		return runner.Result{}, nil
	}
	objs, err := c.vaInformer.GetIndexer().ByIndex(vaByPVIndex, name)
	if err != nil {
		return runner.Result{}, err
	}
	if len(objs) > 0 {
		// A VA delete event re-enqueues this PV.
		return runner.Result{}, nil
	}
	if c.orphanHoldsPV(pv) {
		// A publication whose VolumeAttachment is gone may still be on a
		// node: deleting the PV now would delete a published volume. The
		// orphan's undoing re-enqueues this PV.
		return runner.Result{}, nil
	}
	return runner.Result{}, c.exec.removePVFinalizer(ctx, pv)
}

// observe reads what a decision about va needs from the caches (nothing
// more in trivial mode, where no decision needs the PV or the CSINode).
func (c *Controller) observe(va *storagev1.VolumeAttachment) (decide.Observed, error) {
	obs := decide.Observed{VA: va, Trivial: c.cfg.Trivial}
	if obs.Trivial {
		return obs, nil
	}
	var err error
	if pvName := va.Spec.Source.PersistentVolumeName; pvName != nil {
		if obs.PV, err = c.getPV(*pvName); err != nil {
			return obs, err
		}
	}
	obs.CSINode, err = c.getCSINode(va.Spec.NodeName)
	return obs, err
}

func (c *Controller) getVA(name string) (*storagev1.VolumeAttachment, error) {
	va, ok, err := c.vaCache.Get(name)
	if err != nil || !ok || va.Spec.Attacher != c.cfg.Driver.Name {
		return nil, err
	}
	return va, nil
}

func (c *Controller) getPV(name string) (*v1.PersistentVolume, error) {
	pv, ok, err := c.pvCache.Get(name)
	if err != nil || !ok {
		return nil, err
	}
	return pv, nil
}

func (c *Controller) getCSINode(name string) (*storagev1.CSINode, error) {
	if name == "" {
		return nil, nil
	}
	n, err := c.nodeLister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return n, err
}

// annMigratedTo is the annotation kube-controller-manager's PV controller
// keeps on an in-tree PV while CSI migration is on for its plugin.
const annMigratedTo = "pv.kubernetes.io/migrated-to"

// releasablePV reports whether pv carries our finalizer and no longer
// needs it once no VolumeAttachment refers to it: pv is being deleted, or
// it is an in-tree PV of a plugin migrated to our driver that is not (or
// no longer) annotated as migrated to it — CSI migration was rolled back,
// the in-tree plugin handles it again, and the finalizer must not outlive
// our driver (as upstream's attacher does).
func (c *Controller) releasablePV(pv *v1.PersistentVolume) bool {
	if !slices.Contains(pv.Finalizers, kubenames.PVFinalizer(c.cfg.Driver.Name)) {
		return false
	}
	if pv.DeletionTimestamp != nil {
		return true
	}
	return pv.Spec.CSI == nil && csitrans.New().IsPVMigratable(pv) && pv.Annotations[annMigratedTo] != c.cfg.Driver.Name
}

// migration is CSI migration's translator for one pass:
// csi-translation-lib's, which upstream's attacher always uses, with the
// pass's logger bound (csi-translation-lib logs through the logger it is
// given; package decide takes a translator without one).
type migration struct {
	tr     csitrans.CSITranslator
	logger klog.Logger
}

var _ decide.Translator = migration{}

func (m migration) IsPVMigratable(pv *v1.PersistentVolume) bool { return m.tr.IsPVMigratable(pv) }

func (m migration) TranslateInTreePVToCSI(pv *v1.PersistentVolume) (*v1.PersistentVolume, error) {
	return m.tr.TranslateInTreePVToCSI(m.logger, pv)
}

// translator is the translator of the pass whose logger ctx carries.
func translator(ctx context.Context) decide.Translator {
	return migration{tr: csitrans.New(), logger: klog.FromContext(ctx)}
}
