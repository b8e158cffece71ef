package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Defaults match upstream external-attacher's --retry-interval-start and
// --retry-interval-max flags.
const (
	DefaultRetryIntervalStart = time.Second
	DefaultRetryIntervalMax   = 5 * time.Minute
	DefaultDrainTimeout       = 30 * time.Second
)

// Options configure a Runner. The zero value of every field means "use the
// default".
type Options struct {
	// Name names the queue in metrics (label name) and in logs. Required.
	Name string
	// Workers is the number of keys reconciled in parallel. Default 1.
	Workers int
	// RetryIntervalStart is the delay after the first failure of a key;
	// it doubles with every further failure. Default 1s.
	RetryIntervalStart time.Duration
	// RetryIntervalMax caps the per-key delay. Default 5m.
	RetryIntervalMax time.Duration
	// DrainTimeout bounds how long Run waits, once its context is done, for
	// reconciles already in progress; then their context is cancelled and
	// Run returns ErrDrainTimeout. Default 30s.
	DrainTimeout time.Duration
	// Clock drives backoff, RequeueAfter, the drain timeout and the backlog
	// age. Default: the real clock. Tests pass a fake clock and never sleep.
	Clock clock.WithTicker
	// MetricsProvider receives the standard workqueue metrics: the
	// binary's QueueMetrics, registered with its registry (metrics.go).
	// Nil: client-go's process-wide provider, which records nothing
	// unless something in the process installed one (the in-process
	// kube-apiserver of latch-local and the tests installs
	// component-base's); this package installs none.
	MetricsProvider workqueue.MetricsProvider
}

// ErrDrainTimeout is returned by Run when reconciles were still running
// DrainTimeout after its context was done.
var ErrDrainTimeout = errors.New("reconciles still running after drain timeout")

// Runner feeds the keys of one queue to a Reconciler with a fixed number of
// workers. It is the only code that calls Forget, AddRateLimited and
// AddAfter on its queue; see Reconciler for the contract.
type Runner[K comparable] struct {
	name         string
	reconciler   Reconciler[K]
	workers      int
	drainTimeout time.Duration
	clock        clock.WithTicker

	// queue holds keys, never objects. Its rate limiter is per-key
	// exponential backoff only: a global token bucket would let a burst
	// of failing keys delay healthy ones.
	queue workqueue.TypedRateLimitingInterface[K]
	// ready is the FIFO inside queue, kept for the backlog age.
	ready *timedFIFO[K]

	// passes numbers reconcile passes for the per-pass logger.
	passes  atomic.Uint64
	started atomic.Bool

	// afterPass, when set (tests only), is called after a pass has fully
	// settled: requeue decision made and Done called.
	afterPass func(key K)
}

// New returns a Runner for r. Nothing runs until Run is called; keys
// enqueued before that wait in the queue.
func New[K comparable](r Reconciler[K], opts Options) *Runner[K] {
	if opts.Workers <= 0 {
		opts.Workers = 1
	}
	if opts.RetryIntervalStart <= 0 {
		opts.RetryIntervalStart = DefaultRetryIntervalStart
	}
	if opts.RetryIntervalMax <= 0 {
		opts.RetryIntervalMax = DefaultRetryIntervalMax
	}
	if opts.RetryIntervalMax < opts.RetryIntervalStart {
		opts.RetryIntervalMax = opts.RetryIntervalStart
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}

	// Build the queue bottom-up so the injected clock and our FIFO reach
	// every layer: FIFO → queue (dirty/processing sets, metrics) → delaying
	// queue (AddAfter timers) → rate-limited queue (backoff).
	ready := newTimedFIFO[K](opts.Clock)
	base := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[K]{
		Name:            opts.Name,
		MetricsProvider: opts.MetricsProvider,
		Clock:           opts.Clock,
		Queue:           ready,
	})
	delaying := workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[K]{
		Name:            opts.Name,
		MetricsProvider: opts.MetricsProvider,
		Clock:           opts.Clock,
		Queue:           base,
	})
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[K](opts.RetryIntervalStart, opts.RetryIntervalMax)
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[K]{
		Name:            opts.Name,
		MetricsProvider: opts.MetricsProvider,
		Clock:           opts.Clock,
		DelayingQueue:   delaying,
	})

	return &Runner[K]{
		name:         opts.Name,
		reconciler:   r,
		workers:      opts.Workers,
		drainTimeout: opts.DrainTimeout,
		clock:        opts.Clock,
		queue:        queue,
		ready:        ready,
	}
}

// Enqueue asks for key to be reconciled as soon as a worker is free. It
// does not reset the key's backoff: event handlers call it for every
// relevant change, including changes the controller caused itself, and
// those must not turn a 5-minute backoff into a hot loop.
func (r *Runner[K]) Enqueue(key K) {
	r.ready.unmark(key)
	r.queue.Add(key)
}

// EnqueueLater asks for key to be reconciled once no key enqueued
// otherwise is waiting: a low-priority lane, for work known to be probably
// idle (a controller's start, which wakes every key it knows once), so
// that it does not delay the keys woken by changes. A later Enqueue of a
// key still waiting there moves it to the normal lane. The lanes order
// work only: every key enqueued is reconciled, and under a sustained
// stream of Enqueues a key in the low lane waits until the normal lane is
// empty.
func (r *Runner[K]) EnqueueLater(key K) {
	r.ready.markLater(key)
	r.queue.Add(key)
}

// EnqueueAfter asks for key to be reconciled after d.
func (r *Runner[K]) EnqueueAfter(key K, d time.Duration) {
	r.queue.AddAfter(key, d)
}

// ForgetAndEnqueue resets key's backoff and asks for it to be reconciled as
// soon as a worker is free. Use it when the condition that made the key
// fail has just cleared (a CSINode gained the driver, a Secret appeared), so
// the key does not sit out the rest of a long backoff. A retry that was
// already scheduled still fires later; reconciles are idempotent, so that
// costs one cheap extra pass.
func (r *Runner[K]) ForgetAndEnqueue(key K) {
	r.queue.Forget(key)
	r.ready.unmark(key)
	r.queue.Add(key)
}

// Len returns how many keys are ready and waiting for a worker (not those
// being processed or waiting out a delay). Informational only.
func (r *Runner[K]) Len() int {
	return r.queue.Len()
}

// OldestItemAge returns how long the oldest ready key has been waiting for a
// worker; 0 when none is.
func (r *Runner[K]) OldestItemAge() time.Duration {
	return r.ready.OldestAge()
}

// BacklogCollector returns the collector of OldestItemAgeMetricName for this
// queue, to register with a KubeRegistry (cmd/ uses legacyregistry). It is
// not registered automatically: registries are owned by the binary.
func (r *Runner[K]) BacklogCollector() metrics.StableCollector {
	return newBacklogCollector(r.name, r.OldestItemAge)
}

// Run starts the workers and blocks until ctx is done. It then shuts the
// queue down (keys still waiting are dropped: they are level-based and the
// next process rebuilds them from informers), waits up to DrainTimeout for
// reconciles in progress (cancelling them at once if ctx carries an abort
// context that is done, see WithAbort), and returns. It returns ErrDrainTimeout when some
// did not finish in time; their context is cancelled then. Run may be
// called once.
func (r *Runner[K]) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return fmt.Errorf("run controller %q: already started", r.name)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "controller", r.name)
	ctx = klog.NewContext(ctx, logger)

	// Reconciles get a context that survives ctx (values, not
	// cancellation) until the drain deadline, or until the abort context
	// set with WithAbort is done (the leader lease was lost: work in
	// flight must stop at once, not drain).
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	if abort := abortContext(ctx); abort != nil {
		stop := context.AfterFunc(abort, func() {
			logger.Info("Aborting reconciles in progress")
			cancelWork()
		})
		defer stop()
	}

	logger.Info("Starting workers", "workers", r.workers)
	var wg sync.WaitGroup
	for range r.workers {
		wg.Go(func() {
			for r.processNext(ctx, workCtx) {
			}
		})
	}

	<-ctx.Done()
	logger.Info("Stopping workers")
	r.queue.ShutDown()

	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		logger.Info("Workers stopped")
		return nil
	case <-r.clock.After(r.drainTimeout):
		cancelWork()
		logger.Error(ErrDrainTimeout, "Reconciles did not finish in time; cancelled their context", "drainTimeout", r.drainTimeout)
		return fmt.Errorf("stop controller %q: %w", r.name, ErrDrainTimeout)
	}
}

type abortKey struct{}

// WithAbort returns a copy of ctx that tells Run to cancel the reconciles
// in progress as soon as abort is done, instead of letting them drain
// after ctx is done. The leader election wrapper uses it with the lease's
// context: a replica that lost its lease must not go on calling the driver
// or writing the API while another replica leads.
func WithAbort(ctx, abort context.Context) context.Context {
	return context.WithValue(ctx, abortKey{}, abort)
}

func abortContext(ctx context.Context) context.Context {
	a, _ := ctx.Value(abortKey{}).(context.Context)
	return a
}

// processNext handles one key and reports whether the worker should go on.
func (r *Runner[K]) processNext(stopCtx, workCtx context.Context) bool {
	key, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	if stopCtx.Err() != nil {
		// The queue hands out what it still holds after ShutDown; we are
		// stopping, so drop it instead of starting new work.
		r.queue.Done(key)
		return false
	}
	r.reconcileHandler(workCtx, key)
	r.queue.Done(key)
	if r.afterPass != nil {
		r.afterPass(key)
	}
	return true
}

// reconcileHandler runs one pass for key and is the only place that decides
// how the key is requeued.
func (r *Runner[K]) reconcileHandler(ctx context.Context, key K) {
	pass := r.passes.Add(1)
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "key", key, "pass", pass)
	ctx = klog.NewContext(ctx, logger)

	start := r.clock.Now()
	logger.V(5).Info("Reconcile started")
	result, err := r.reconcile(ctx, key)
	duration := r.clock.Since(start)

	switch {
	case err != nil && IsTerminal(err):
		r.queue.Forget(key)
		logger.Error(err, "Reconcile failed with a terminal error; not retrying until the object changes", "duration", duration)
	case err != nil:
		r.queue.AddRateLimited(key)
		if result.RequeueAfter > 0 {
			logger.V(4).Info("Ignoring RequeueAfter because the reconcile failed", "requeueAfter", result.RequeueAfter)
		}
		logger.Error(err, "Reconcile failed; retrying with backoff", "failures", r.queue.NumRequeues(key), "duration", duration)
	case result.RequeueAfter > 0:
		r.queue.Forget(key)
		r.queue.AddAfter(key, result.RequeueAfter)
		logger.V(5).Info("Reconcile succeeded; requeued", "requeueAfter", result.RequeueAfter, "duration", duration)
	default:
		r.queue.Forget(key)
		logger.V(5).Info("Reconcile succeeded", "duration", duration)
	}
}

// reconcile calls the Reconciler and turns a panic into an ordinary
// (retried) error: one bad object must not take down a controller that
// serves every other object.
func (r *Runner[K]) reconcile(ctx context.Context, key K) (result Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			klog.FromContext(ctx).Error(nil, "Reconcile panicked", "panic", p, "stack", string(debug.Stack()))
			result, err = Result{}, fmt.Errorf("reconcile %v: panic: %v", key, p)
		}
	}()
	return r.reconciler.Reconcile(ctx, key)
}
