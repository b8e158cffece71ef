package attacher

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csi"
)

// callResult is what came of a CSI call the executor was asked to make.
type callResult struct {
	// secrets are the controller-publish secret's values the call was
	// made with (nil: none).
	secrets map[string]string
	// blocked: decide.BeforeCall refused the call (a missing or forbidden
	// Secret, a capability that cannot be built); nothing was called.
	blocked *Blocked
	// callErr is the driver's error, already counted in the metrics.
	callErr error
}

// unpublication is one ControllerUnpublish: of a detach, of a publication
// recorded under an old node ID, or of an orphan.
type unpublication struct {
	handle, nodeID string
	// secretRef is read when secrets is nil (an orphan keeps the values
	// its publish used, until a restart).
	secretRef *v1.SecretReference
	secrets   map[string]string
	// migrated labels the call's metrics as made for a migrated in-tree
	// volume.
	migrated bool
}

// publish calls ControllerPublish for plan: the secret read, the
// capability built, decide.BeforeCall asked, an attach slot taken and the
// call bounded by the timeout. It returns the publish context; err is a
// failure before the call (the secret read, the wait for a slot).
func (e *executor) publish(ctx context.Context, plan decide.AttachPlan) (map[string]string, callResult, error) {
	capability, capErr := csi.VolumeCapability(csi.CapabilityInput{
		AccessModes: plan.Volume.AccessModes, Block: plan.Volume.Block, FSType: plan.Volume.FSType,
		MountOptions: plan.Volume.MountOptions, SingleNodeMultiWriter: e.driver.SupportsSingleNodeMultiWriter,
	})
	var publishContext map[string]string
	res, err := e.call(ctx, e.attachSlots, "attach", plan.Volume.Migrated, plan.Volume.Secret, nil, capErr,
		func(ctx context.Context, secrets map[string]string) error {
			var err error
			publishContext, err = e.csi.ControllerPublish(ctx, csi.PublishRequest{
				VolumeID:      plan.Volume.Handle,
				NodeID:        plan.NodeID,
				Capability:    capability,
				ReadOnly:      plan.Volume.ReadOnly,
				VolumeContext: plan.Volume.VolumeContext,
				Secrets:       secrets,
			})
			return err
		})
	return publishContext, res, err
}

// unpublish calls ControllerUnpublish for u, the one path of a detach, of
// an unpublication before a node ID is rewritten and of an orphan: the
// secret read (unless u carries its values), decide.BeforeCall asked, a
// detach slot taken and the call bounded by the timeout.
func (e *executor) unpublish(ctx context.Context, u unpublication) (callResult, error) {
	return e.call(ctx, e.detachSlots, "detach", u.migrated, u.secretRef, u.secrets, nil,
		func(ctx context.Context, secrets map[string]string) error {
			return e.csi.ControllerUnpublish(ctx, u.handle, u.nodeID, secrets)
		})
}

// call makes one CSI call of op ("attach" or "detach"): secrets are read
// through ref unless given, the call is made only when decide.BeforeCall
// allows it, in one of slots and within the timeout (which starts once the
// slot is held), with the migrated label; a driver error is counted.
func (e *executor) call(ctx context.Context, slots callSlots, op string, migrated bool, ref *v1.SecretReference, secrets map[string]string, capErr error,
	fn func(ctx context.Context, secrets map[string]string) error) (callResult, error) {
	var facts decide.CallFacts
	if secrets == nil {
		var err error
		if secrets, facts, err = e.secrets(ctx, ref); err != nil {
			return callResult{}, err
		}
	}
	facts.CapabilityErr = capErr
	if blocked := decide.BeforeCall(facts); blocked != nil {
		return callResult{blocked: blocked}, nil
	}
	release, err := slots.acquire(ctx)
	if err != nil {
		return callResult{}, err
	}
	callCtx, cancel := context.WithTimeout(csi.WithMigrated(ctx, migrated), e.timeout)
	err = fn(callCtx, secrets)
	cancel()
	release()
	if err != nil {
		e.metrics.csiError(op, err)
	}
	return callResult{secrets: secrets, callErr: err}, nil
}
