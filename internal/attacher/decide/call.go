package decide

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
)

// The second half of a decision, made only when a plan calls the driver:
// the facts it needs are costly (an API read of the Secret) or built with
// the CSI types this package may not import (the VolumeCapability), so the
// pass reads them once a plan says it will call, and WithCallFacts and
// DetachWithCallFacts mark in the plan the calls that may not be made. The
// executor makes a call only when its plan allows it.

// SecretState is what reading a controller-publish secret found.
type SecretState int

const (
	// SecretNone: the volume names no secret, or it was read.
	SecretNone SecretState = iota
	// SecretNotFound: the Secret does not exist (yet).
	SecretNotFound
	// SecretForbidden: csi-attacher may not read it.
	SecretForbidden
)

// CallFacts are read only when a plan is about to call the driver.
type CallFacts struct {
	// Secret is the volume's controller-publish secret reference (nil:
	// none) and SecretState what reading it found; SecretDenial is the
	// API server's message when it refused the read.
	Secret       *v1.SecretReference
	SecretState  SecretState
	SecretDenial string
	// CapabilityErr is why the CSI VolumeCapability for the volume could
	// not be built (ControllerPublish only; nil when it could, or for an
	// unpublish, which sends none).
	CapabilityErr error
}

// BeforeCall decides whether the driver may be called now, or why not: a
// missing or unreadable secret (ClassWaitForObject: polled, secrets are
// not watched) comes first, then a capability the access modes cannot be
// mapped to (ClassRetry: a PV's access modes are immutable, but the
// VolumeAttachment's attachError says why it is not attached). Nil: call.
func BeforeCall(f CallFacts) *Blocked {
	switch ref := f.Secret; {
	case ref != nil && f.SecretState == SecretNotFound:
		return &Blocked{Reason: ReasonWaitingForSecret, Message: fmt.Sprintf("controller publish secret %s/%s not found", ref.Namespace, ref.Name)}
	case ref != nil && f.SecretState == SecretForbidden:
		return &Blocked{Reason: ReasonSecretForbidden, Message: fmt.Sprintf(
			"controller publish secret %s/%s: csi-attacher is not allowed to read it (%s); grant its ServiceAccount a Role with verbs [get] on resource secrets in namespace %q",
			ref.Namespace, ref.Name, f.SecretDenial, ref.Namespace)}
	case f.CapabilityErr != nil:
		return &Blocked{Reason: ReasonInvalidCapabilities, Message: f.CapabilityErr.Error()}
	}
	return nil
}

// CallsDriver reports whether plan calls the driver (ControllerPublish, and
// the unpublish of a publication recorded under an old node ID before it):
// only then are its call facts read.
func (plan AttachPlan) CallsDriver() bool { return plan.Publish || plan.UnpublishFirst != nil }

// WithCallFacts returns plan with the calls f forbids marked: PublishBlocked
// for ControllerPublish (BeforeCall on every fact), UnpublishFirst.Blocked
// for the unpublish before it, which sends no capability (BeforeCall on the
// secret alone).
func WithCallFacts(plan AttachPlan, f CallFacts) AttachPlan {
	if plan.Publish {
		plan.PublishBlocked = BeforeCall(f)
	}
	if u := plan.UnpublishFirst; u != nil {
		withoutCapability := f
		withoutCapability.CapabilityErr = nil
		cp := *u
		cp.Blocked = BeforeCall(withoutCapability)
		plan.UnpublishFirst = &cp
	}
	return plan
}

// CallsDriver reports whether plan calls ControllerUnpublish.
func (plan DetachPlan) CallsDriver() bool { return !plan.Done && plan.Blocked == nil }

// DetachWithCallFacts returns plan with CallBlocked set when f forbids the
// ControllerUnpublish (BeforeCall: a missing or forbidden secret).
func DetachWithCallFacts(plan DetachPlan, f CallFacts) DetachPlan {
	if plan.CallsDriver() {
		f.CapabilityErr = nil
		plan.CallBlocked = BeforeCall(f)
	}
	return plan
}
