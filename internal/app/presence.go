package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/runner"
)

// Presence makes a process that runs without leader election still hold
// its Lease while it works, so that a second active instance (two replicas
// without --leader-election, the surge Pod of a rolling update) is noticed
// instead of racing this one: see runWithPresence. Only csi-attacher sets
// it (LeaderElection.Presence).
type Presence struct {
	// Component is the source of the Warning event, e.g.
	// "csi-attacher <driver>".
	Component string
	// Competing receives 1 while another identity holds the Lease and this
	// process therefore does no work, 0 otherwise: csi-attacher's
	// latch_attacher_competing_instances, made and registered by the
	// process that runs it (attacher.Metrics); tests give each replica its
	// own. Nil records nothing: this package registers no metric.
	Competing GaugeSetter
	// Clock; nil means the real one.
	Clock clock.Clock
	// PodUID is the UID of the Pod this process runs in (csi-attacher
	// reads POD_UID, which the manifests set from the downward API). It
	// is appended to the Lease holder identity ("<identity>_pod-<UID>"),
	// so that the next process of the same Pod, after its container
	// restarted, recognises the holder as its dead predecessor and takes
	// the Lease over at once instead of waiting out the lease duration
	// and reporting it as a competing instance. A container restart means
	// the old process has exited; two containers of one Pod running an
	// attacher of the same driver would take the Lease from each other
	// (a misconfiguration). Empty: not known; a restarted container waits
	// for its predecessor's Lease to expire, as another replica does.
	PodUID string
}

// podIdentitySeparator joins a presence identity and its Pod's UID.
const podIdentitySeparator = "_pod-"

// presenceIdentity is the Lease holder identity of a process with the
// given identity in the Pod with UID podUID ("" when not known).
func presenceIdentity(identity, podUID string) string {
	if podUID == "" {
		return identity
	}
	return identity + podIdentitySeparator + podUID
}

// GaugeSetter is the part of a gauge Presence uses.
type GaugeSetter interface{ Set(float64) }

// EventReasonCompetingAttacher is the reason of the Warning event on the
// Lease when a process running without leader election finds another
// identity active.
const EventReasonCompetingAttacher = "CompetingAttacher"

// ErrCompetingInstance is returned by RunAsLeader (leader election
// disabled, Presence set) when another identity took the Lease while this
// process worked: the work in flight is aborted and the process should
// exit, to come back as one that waits.
var ErrCompetingInstance = errors.New("another instance holds the Lease")

// noGauge records nothing: a Presence without a gauge.
type noGauge struct{}

func (noGauge) Set(float64) {}

// presenceStep is what one look at the Lease decides.
type presenceStep int

const (
	stepCreate   presenceStep = iota // no Lease: create it, holding it
	stepRenew                        // ours: renew
	stepTakeOver                     // free, released or expired: take it
	stepSucceed                      // this Pod's previous process holds it: take it at once
	stepWait                         // another identity holds it: do no work
)

// presenceFacts is what one look at the Lease decides on.
type presenceFacts struct {
	// lease is nil when it does not exist.
	lease *coordinationv1.Lease
	// self is this process's holder identity, podUID its Pod's UID (""
	// when not known).
	self, podUID string
	// working: this process holds the Lease and works (it renews);
	// otherwise it waits to start.
	working bool
	// unchangedFor is how long (by our own clock, as client-go's elector
	// measures it, so clock skew does not matter) the holder and renew
	// time have stayed what they are now.
	unchangedFor time.Duration
}

// decidePresence is the pure decision of one look at the Lease.
func decidePresence(f presenceFacts) presenceStep {
	lease := f.lease
	if lease == nil {
		return stepCreate
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	switch {
	case holder == f.self:
		return stepRenew
	case holder == "":
		return stepTakeOver
	case !f.working && f.podUID != "" && strings.HasSuffix(holder, podIdentitySeparator+f.podUID):
		// Held by an earlier process of this Pod: its container
		// restarted, so that process has exited. (While working, another
		// process of this Pod taking the Lease means two attachers in one
		// Pod: stop, as for any other identity.)
		return stepSucceed
	}
	d := time.Duration(0)
	if lease.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}
	if f.unchangedFor > d {
		return stepTakeOver
	}
	return stepWait
}

// presence holds the Lease for one process without leader election.
type presence struct {
	client kubernetes.Interface
	cfg    LeaderElection
	clock  clock.Clock
	gauge  GaugeSetter
	rec    record.EventRecorder

	// What the last look saw of another holder, and since when (by our
	// clock) it has not changed.
	seenHolder, seenRenew string
	seenSince             time.Time
	// reported is the other identity last reported, so that the error log
	// and the event are written once per competitor, not every period.
	reported string
	// ours is the Lease as this process's last write of it returned it;
	// nil before the first and after a write that failed. A renewal while
	// working updates it as is (renewOurs): one request, where a read and
	// a write would queue twice behind the API server's other work.
	ours *coordinationv1.Lease
}

// look reads the Lease once and acts on decidePresence: it returns whether
// this process holds the Lease now and, when not, the other identity.
// working says whether this process holds the Lease and works.
func (p *presence) look(ctx context.Context, working bool) (held bool, other string, err error) {
	leases := p.client.CoordinationV1().Leases(p.cfg.Namespace)
	if working && p.ours != nil && p.renewOurs(ctx) {
		return true, "", nil
	}
	lease, err := leases.Get(ctx, p.cfg.LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease, err = nil, nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get Lease %s/%s: %w", p.cfg.Namespace, p.cfg.LeaseName, err)
	}
	now := p.clock.Now()
	unchanged := time.Duration(0)
	if lease != nil {
		h, r := "", ""
		if lease.Spec.HolderIdentity != nil {
			h = *lease.Spec.HolderIdentity
		}
		if lease.Spec.RenewTime != nil {
			r = lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
		}
		if h != p.seenHolder || r != p.seenRenew || p.seenSince.IsZero() {
			p.seenHolder, p.seenRenew, p.seenSince = h, r, now
		}
		unchanged = now.Sub(p.seenSince)
	}
	nowMicro := metav1.NewMicroTime(now)
	seconds := int32(p.cfg.LeaseDuration / time.Second)
	step := decidePresence(presenceFacts{lease: lease, self: p.cfg.Identity, podUID: p.cfg.Presence.PodUID, working: working, unchangedFor: unchanged})
	if step == stepSucceed {
		klog.FromContext(ctx).Info("The Lease is held by this Pod's previous csi-attacher process (its container restarted); taking it over at once",
			"lease", klog.KRef(p.cfg.Namespace, p.cfg.LeaseName), "identity", p.cfg.Identity, "previousIdentity", p.seenHolder)
	}
	switch step {
	case stepCreate:
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.cfg.Namespace, Name: p.cfg.LeaseName, Labels: p.cfg.Labels},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &p.cfg.Identity, LeaseDurationSeconds: &seconds,
				AcquireTime: &nowMicro, RenewTime: &nowMicro,
			},
		}
		created, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			return false, "", fmt.Errorf("create Lease %s/%s: %w", p.cfg.Namespace, p.cfg.LeaseName, err)
		}
		p.ours = created
		return true, "", nil
	case stepRenew, stepTakeOver, stepSucceed:
		l := lease.DeepCopy()
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != p.cfg.Identity {
			transitions := int32(0)
			if l.Spec.LeaseTransitions != nil {
				transitions = *l.Spec.LeaseTransitions + 1
			}
			l.Spec.LeaseTransitions = &transitions
			l.Spec.AcquireTime = &nowMicro
		}
		l.Spec.HolderIdentity = &p.cfg.Identity
		l.Spec.LeaseDurationSeconds = &seconds
		l.Spec.RenewTime = &nowMicro
		// The resourceVersion from Get makes this a compare-and-swap:
		// of two processes taking over at once, one gets a conflict.
		updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if err != nil {
			return false, "", fmt.Errorf("update Lease %s/%s: %w", p.cfg.Namespace, p.cfg.LeaseName, err)
		}
		p.ours = updated
		return true, "", nil
	default:
		return false, p.seenHolder, nil
	}
}

// renewOurs renews the Lease as this process last wrote it, without
// reading it first, as client-go's elector renews a Lease it holds: the
// update carries the resourceVersion of our last write, so it succeeds
// only if nobody wrote the Lease since, which is what a read would have
// shown. Any failure (another holder's write makes it a conflict) leaves
// the renewal to a read and a decision (look); false then.
func (p *presence) renewOurs(ctx context.Context) bool {
	l := p.ours.DeepCopy()
	p.ours = nil
	now := metav1.NewMicroTime(p.clock.Now())
	seconds := int32(p.cfg.LeaseDuration / time.Second)
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &seconds
	updated, err := p.client.CoordinationV1().Leases(p.cfg.Namespace).Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		klog.FromContext(ctx).V(4).Info("Renewing the Lease as last written failed; reading it", "lease", klog.KRef(p.cfg.Namespace, p.cfg.LeaseName), "err", err)
		return false
	}
	p.ours = updated
	return true
}

// competing reports another active identity: an error log line and a
// Warning event once per competitor, and the gauge.
func (p *presence) competing(ctx context.Context, other string, working bool) {
	p.gauge.Set(1)
	if other == p.reported {
		return
	}
	p.reported = other
	what := "it does no work until that one stops"
	if working {
		what = "it stops working and exits"
	}
	klog.FromContext(ctx).Error(nil, "Another csi-attacher is active for this driver; this one runs without --leader-election and "+what,
		"lease", klog.KRef(p.cfg.Namespace, p.cfg.LeaseName), "identity", p.cfg.Identity, "otherIdentity", other)
	ref := &v1.ObjectReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Namespace: p.cfg.Namespace, Name: p.cfg.LeaseName}
	p.rec.Eventf(ref, v1.EventTypeWarning, EventReasonCompetingAttacher,
		"%s runs without --leader-election and found %s active for the same driver (holder of this Lease); %s. Run every replica with --leader-election.",
		p.cfg.Identity, other, what)
}

func (p *presence) alone() {
	p.gauge.Set(0)
	p.reported = ""
}

// release gives the Lease up when this process holds it, as client-go's
// elector does on ReleaseOnCancel, so that a waiting instance starts at
// once instead of after a lease duration.
func (p *presence) release(ctx context.Context) {
	leases := p.client.CoordinationV1().Leases(p.cfg.Namespace)
	lease, err := leases.Get(ctx, p.cfg.LeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != p.cfg.Identity {
		return
	}
	l := lease.DeepCopy()
	empty, one := "", int32(1)
	now := metav1.NewMicroTime(p.clock.Now())
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &empty, &one, &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot release the Lease", "lease", klog.KRef(p.cfg.Namespace, p.cfg.LeaseName))
	}
}

// runWithPresence runs run like RunAsLeader with leader election disabled,
// except that this process holds the Lease while it works:
//
//   - Before starting, it takes the Lease when it is absent, released or
//     expired, or held by an earlier process of its own Pod
//     (Presence.PodUID): a container restart means that process exited.
//     While another identity holds it, this process reports that
//     (Presence) and waits: two active attachers of one driver race each
//     other (a slow ControllerPublish of one lands after the other has
//     unpublished that volume), so refusing work is the safe choice.
//   - While working, it renews the Lease every RetryPeriod (every half
//     renew deadline when that is shorter), counted from when the last
//     renewal was sent, with one request: an update of the Lease as this
//     process last wrote it, which its resourceVersion makes fail if
//     anybody wrote the Lease since (then the Lease is read and decided
//     on, as before work). A renewal thus has the renew deadline less
//     the retry period to return (5 s with the defaults), whatever the one
//     before took. If another
//     identity holds it (this process failed to renew for a whole lease
//     duration and the other took over), the work in flight is aborted
//     and ErrCompetingInstance returned, as a lost lease does.
//   - Renewals that fail for the renew deadline (RenewDeadline, below the
//     lease duration; two thirds of it when unset), counted from when the
//     last renewal that found the Lease ours was sent, stop the work
//     however they fail: an error, a timeout, or a request that hangs
//     (the work stops with it still in flight). By then
//     another replica may be about to take the expired Lease over, and
//     this one, cut off from the API server, would keep calling the
//     driver from a stale cache beside it. The work in flight is aborted
//     and ErrLostLease returned, as the elector does when renewals fail;
//     the process restarts and waits for the Lease like any candidate.
//     (Upstream without leader election has no Lease and never stops;
//     latch's presence is an addition, and a replica that cannot reach
//     the API server can do nothing safe anyway.)
//   - When the API refuses Leases (no RBAC, 403), the check is impossible:
//     an error is logged once and run runs unguarded, as upstream's would.
func runWithPresence(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, run func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = 5 * time.Second
	}
	if cfg.LeaseDuration < time.Second {
		cfg.LeaseDuration = 15 * time.Second
	}
	cfg.Identity = presenceIdentity(cfg.Identity, cfg.Presence.PodUID)
	if cfg.Presence.PodUID == "" {
		logger.Info("The Pod's UID is not known (set POD_UID from the downward API, as the manifests do): after a restart of this container, csi-attacher waits for the Lease of its previous process to expire and reports that process as another active instance",
			"lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "identity", cfg.Identity, "leaseDuration", cfg.LeaseDuration)
	}
	p := &presence{client: client, cfg: cfg, clock: cfg.Presence.Clock, gauge: cfg.Presence.Competing}
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	if p.gauge == nil {
		p.gauge = noGauge{}
	}
	events := kube.StartEvents(ctx, client)
	defer events.Stop()
	p.rec = events.NewRecorder(v1.EventSource{Component: cfg.Presence.Component})
	p.gauge.Set(0)

	// Before work: wait until this process holds the Lease.
	lastErr := ""
	var acquired time.Time // when the look that took the Lease was sent
	for {
		acquired = p.clock.Now()
		held, other, err := p.look(ctx, false)
		if apierrors.IsForbidden(err) {
			logger.Error(err, "Cannot check for a second active csi-attacher of this driver: no access to its Lease; running without that check. Grant get/create/update on leases (deploy/ does) or run with --leader-election",
				"lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "identity", cfg.Identity)
			return run(ctx)
		}
		if err != nil && err.Error() != lastErr {
			logger.Error(err, "Cannot hold the Lease; retrying", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName))
			lastErr = err.Error()
		}
		if held {
			break
		}
		if other != "" {
			p.competing(ctx, other, false)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.clock.After(cfg.RetryPeriod):
		}
	}
	if p.reported != "" {
		logger.Info("The other csi-attacher stopped; this one holds the Lease and starts", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "identity", cfg.Identity)
	}
	p.alone()
	logger.V(2).Info("Holding the Lease without leader election", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "identity", cfg.Identity)

	renewDeadline := cfg.RenewDeadline
	if renewDeadline <= 0 || renewDeadline >= cfg.LeaseDuration {
		renewDeadline = cfg.LeaseDuration * 2 / 3
	}
	// Renewing less often than the deadline allows would stop the work
	// between two successful renewals.
	renewEvery := min(cfg.RetryPeriod, renewDeadline/2)

	abortCtx, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	done := make(chan error, 1)
	go func() { done <- run(runner.WithAbort(runCtx, abortCtx)) }()

	// The deadline fires renewDeadline after the last renewal that found
	// the Lease ours was sent (another replica counts the lease duration
	// from no earlier), whatever the renewals in between do: fail, time
	// out, or hang.
	deadline := p.clock.NewTimer(renewDeadline - p.clock.Since(acquired))
	defer deadline.Stop()
	// Renewals are sent every renewEvery, counted from when the last one
	// was sent, not from when it returned: a slow renewal must not take
	// its time from the next one's, which has the rest of the renew
	// deadline counted from the last renewal that found the Lease ours.
	lastSent := acquired
	lastErr = ""
	var renewErr error
	for {
		select {
		case err := <-done:
			p.release(context.WithoutCancel(ctx))
			return err
		case <-deadline.C():
			return p.stopAtDeadline(ctx, renewDeadline, renewErr, abort, cancelRun, done)
		case <-p.renewDue(lastSent, renewEvery):
		}
		// Renew also while run drains after ctx is done, as the elector
		// does: the Lease must stay ours while calls are in flight.
		sent := p.clock.Now()
		lastSent = sent
		r, ok := p.renew(ctx, deadline.C())
		if !ok {
			hung := errors.New("the renewal in flight had not returned")
			if renewErr != nil {
				hung = fmt.Errorf("the renewal in flight had not returned; the one before failed: %w", renewErr)
			}
			return p.stopAtDeadline(ctx, renewDeadline, hung, abort, cancelRun, done)
		}
		switch {
		case r.held:
			lastErr, renewErr = "", nil
			resetTimer(deadline, renewDeadline-p.clock.Since(sent))
		case r.err != nil:
			renewErr = r.err
			if r.err.Error() != lastErr {
				logger.Error(r.err, "Cannot renew the Lease; working on until the renew deadline", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "renewDeadline", renewDeadline)
				lastErr = r.err.Error()
			}
		case r.other != "":
			p.competing(ctx, r.other, true)
			abort()
			cancelRun()
			<-done
			return fmt.Errorf("%w: Lease %s/%s is held by %s, not %s", ErrCompetingInstance, cfg.Namespace, cfg.LeaseName, r.other, cfg.Identity)
		}
	}
}

type lookResult struct {
	held  bool
	other string
	err   error
}

// renew looks at the Lease once (p.look) while this process works. It
// gives up when deadline fires first: ok is false then and the look, its
// context cancelled, is left to end on its own (it no longer touches
// anything the caller reads).
func (p *presence) renew(ctx context.Context, deadline <-chan time.Time) (r lookResult, ok bool) {
	lookCtx, cancelLook := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelLook()
	res := make(chan lookResult, 1)
	go func() {
		var r lookResult
		r.held, r.other, r.err = p.look(lookCtx, true)
		res <- r
	}()
	select {
	case r := <-res:
		return r, true
	case <-deadline:
		return lookResult{}, false
	}
}

// stopAtDeadline aborts the work in flight because the Lease was not
// renewed for the renew deadline (last says how the renewals failed) and
// returns ErrLostLease once run has returned.
func (p *presence) stopAtDeadline(ctx context.Context, renewDeadline time.Duration, last error, abort, cancelRun context.CancelFunc, done <-chan error) error {
	if last == nil {
		last = errors.New("the Lease could not be renewed")
	}
	klog.FromContext(ctx).Error(last, "Cannot renew the Lease for the renew deadline: another csi-attacher may take it over; aborting the work in flight and stopping",
		"lease", klog.KRef(p.cfg.Namespace, p.cfg.LeaseName), "identity", p.cfg.Identity, "renewDeadline", renewDeadline)
	abort()
	cancelRun()
	<-done
	return fmt.Errorf("%w: Lease %s/%s not renewed for %s: %v", ErrLostLease, p.cfg.Namespace, p.cfg.LeaseName, renewDeadline, last)
}

// renewDue fires when the renewal after the one sent at lastSent is due,
// every renewEvery; at once when that time has passed (the last renewal
// took longer).
func (p *presence) renewDue(lastSent time.Time, renewEvery time.Duration) <-chan time.Time {
	wait := renewEvery - p.clock.Since(lastSent)
	if wait > 0 {
		return p.clock.After(wait)
	}
	due := make(chan time.Time, 1)
	due <- p.clock.Now()
	return due
}

// resetTimer makes t fire after d, with no expiry of before left in its
// channel.
func resetTimer(t clock.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C():
		default:
		}
	}
	t.Reset(d)
}
