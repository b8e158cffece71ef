package app

import (
	"context"
	"fmt"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// releaseGuardedLock is client-go's LeaseLock with one fix: a release
// (an update that empties the holder) is written only while the Lease,
// read again, is still held by this identity.
//
// client-go's elector releases the Lease (ReleaseOnCancel) whenever its
// renew loop ends, also after renewals failed for the renew deadline. Its
// release reads the Lease again but decides on the holder it observed
// before: when another replica took the Lease over meanwhile, the update
// (with the fresh resourceVersion) clears the new leader's holder, and any
// candidate may acquire the Lease while the new leader still works.
type releaseGuardedLock struct {
	*resourcelock.LeaseLock
}

var _ resourcelock.Interface = releaseGuardedLock{}

// Update writes ler; a release (empty holder) only while this identity
// holds the Lease as read now. Otherwise it writes nothing and says why
// (the elector logs "Failed to release lease").
func (l releaseGuardedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		cur, _, err := l.LeaseLock.Get(ctx)
		if err != nil {
			return fmt.Errorf("read the Lease before releasing it: %w", err)
		}
		if cur.HolderIdentity != l.Identity() {
			return fmt.Errorf("not releasing the Lease: %q holds it now, not %q", cur.HolderIdentity, l.Identity())
		}
	}
	return l.LeaseLock.Update(ctx, ler)
}
