// Package runner is the one place in latch that drives a workqueue.
//
// A controller implements Reconciler for one kind of key (an object name,
// never an object) and hands it to a Runner. The Runner owns the typed
// rate-limited queue, the workers, the per-item exponential backoff and the
// per-pass contextual logger; reconcilers only return a Result and an
// error and never requeue themselves. Keeping every Forget, AddRateLimited
// and AddAfter call in runner.go is what makes the retry behaviour of both
// binaries reviewable in one sitting (the controller-runtime
// reconcileHandler model).
package runner
