package decide

import (
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// publishScenario runs the three steps of a publish's outcome as the
// executor does (AfterPublish, the write, VAFate with a live read when it
// asks for one, PublishOutcome) on scripted answers: write is how the
// status write answers, written what a sent write returned, live what a
// live read finds (made only when VAFate asks).
type publishScenario struct {
	name    string
	answer  Published
	write   StatusWrite
	written *storagev1.VolumeAttachment
	live    Sighting

	wantRecord PublishRecord
	wantRead   bool
	want       Outcome
}

func (sc publishScenario) run() (PublishRecord, bool, Outcome) {
	rec := AfterPublish(sc.answer)
	facts := FateFacts{UID: "u1", Driver: testDriver, Write: sc.write}
	if !rec.Attached && rec.MayBePublished && sc.write == WriteSent {
		facts.Written = sc.written
	}
	fate, read := FateKept, false
	if rec.Attached || rec.MayBePublished {
		if fate, read = VAFate(facts); read {
			facts.Live = sc.live
			facts.Live.Made = true
			fate, _ = VAFate(facts)
		}
	}
	writeFailed := sc.write == WriteNotFound || sc.write == WriteRefused || sc.write == WriteFailed
	return rec, read, PublishOutcome(sc.answer, fate, writeFailed)
}

func fateVA(mods ...func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-1", UID: "u1", Finalizers: []string{kubenames.AttacherFinalizer(testDriver)}}}
	for _, m := range mods {
		m(va)
	}
	return va
}

func deletingWithoutOurFinalizer(va *storagev1.VolumeAttachment) {
	now := metav1.Now()
	va.DeletionTimestamp = &now
	va.Finalizers = []string{"other/keep"}
}

func replaced(va *storagev1.VolumeAttachment) { va.UID = types.UID("u2") }

func TestPublishOutcomeScenarios(t *testing.T) {
	uncertain := errors.New("rpc error: code = DeadlineExceeded desc = context deadline exceeded")
	final := errors.New("rpc error: code = NotFound desc = no such volume")
	throttled := errors.New("rpc error: code = ResourceExhausted desc = Request limit exceeded")
	tooLarge := map[string]string{"k": strings.Repeat("x", MaxAttachmentMetadataBytes+1)}

	for _, sc := range []publishScenario{
		// A successful publish.
		{name: "published, status written → attached",
			write: WriteSent, wantRecord: PublishRecord{Attached: true}, want: Outcome{Kind: OutcomeAttached}},
		{name: "published, status write NotFound → orphan, certain",
			write: WriteNotFound, wantRecord: PublishRecord{Attached: true}, want: Outcome{Kind: OutcomeOrphaned}},
		{name: "published, status write refused (UID precondition), live read: another object of the name → orphan",
			write: WriteRefused, live: Sighting{VA: fateVA(replaced)}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeOrphaned}},
		{name: "published, status write refused, live read: not found → orphan",
			write: WriteRefused, live: Sighting{}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeOrphaned}},
		{name: "published, status write refused (a conflict), live read: the same object → the write's error, retried",
			write: WriteRefused, live: Sighting{VA: fateVA()}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeWriteFailed}},
		{name: "published, status write refused, live read fails → suspect",
			write: WriteRefused, live: Sighting{Failed: true}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeSuspect}},
		{name: "published, status write failed (500) → suspect, no read",
			write: WriteFailed, wantRecord: PublishRecord{Attached: true}, want: Outcome{Kind: OutcomeSuspect}},
		{name: "published, status already attached (nothing sent), live read: the same object → attached",
			write: WriteUnneeded, live: Sighting{VA: fateVA()}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeAttached}},
		{name: "published, status already attached, live read: deleting without our finalizer → orphan",
			write: WriteUnneeded, live: Sighting{VA: fateVA(deletingWithoutOurFinalizer)}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeOrphaned}},
		{name: "published, status already attached, live read fails → suspect",
			write: WriteUnneeded, live: Sighting{Failed: true}, wantRecord: PublishRecord{Attached: true}, wantRead: true, want: Outcome{Kind: OutcomeSuspect}},

		// A publish context too large for status.attachmentMetadata.
		{name: "published with a publish context too large, error recorded, object kept → terminal failure",
			answer: Published{Context: tooLarge}, write: WriteSent, written: fateVA(),
			wantRecord: PublishRecord{Blocked: CheckPublishContext(tooLarge), MayBePublished: true}, want: Outcome{Kind: OutcomeFailed, Terminal: true}},
		{name: "published with a publish context too large, the write returned it deleting without our finalizer → orphan, certain",
			answer: Published{Context: tooLarge}, write: WriteSent, written: fateVA(deletingWithoutOurFinalizer),
			wantRecord: PublishRecord{Blocked: CheckPublishContext(tooLarge), MayBePublished: true}, want: Outcome{Kind: OutcomeOrphaned}},
		{name: "published with a publish context too large, error already recorded, live read: gone → orphan",
			answer: Published{Context: tooLarge}, write: WriteUnneeded, live: Sighting{},
			wantRecord: PublishRecord{Blocked: CheckPublishContext(tooLarge), MayBePublished: true}, wantRead: true, want: Outcome{Kind: OutcomeOrphaned}},

		// A driver error that leaves the publish open.
		{name: "may still be in progress, error recorded, object kept → failure, retried with backoff",
			answer: Published{Err: uncertain}, write: WriteSent, written: fateVA(),
			wantRecord: PublishRecord{MayBePublished: true}, want: Outcome{Kind: OutcomeFailed}},
		{name: "may still be in progress, the write returned another object of the name → failure (only the same UID is judged)",
			answer: Published{Err: uncertain}, write: WriteSent, written: fateVA(replaced, deletingWithoutOurFinalizer),
			wantRecord: PublishRecord{MayBePublished: true}, want: Outcome{Kind: OutcomeFailed}},
		{name: "may still be in progress, error write NotFound → orphan, uncertain",
			answer: Published{Err: uncertain}, write: WriteNotFound,
			wantRecord: PublishRecord{MayBePublished: true}, want: Outcome{Kind: OutcomeOrphaned, Uncertain: true}},
		{name: "may still be in progress, error write failed (500) → suspect, uncertain",
			answer: Published{Err: uncertain}, write: WriteFailed,
			wantRecord: PublishRecord{MayBePublished: true}, want: Outcome{Kind: OutcomeSuspect, Uncertain: true}},
		{name: "may still be in progress, error already recorded, live read fails → suspect, uncertain",
			answer: Published{Err: uncertain}, write: WriteUnneeded, live: Sighting{Failed: true},
			wantRecord: PublishRecord{MayBePublished: true}, wantRead: true, want: Outcome{Kind: OutcomeSuspect, Uncertain: true}},
		{name: "throttled, error recorded, object kept → throttled retry without backoff",
			answer: Published{Err: throttled, Throttled: true}, write: WriteSent, written: fateVA(),
			wantRecord: PublishRecord{MayBePublished: true}, want: Outcome{Kind: OutcomeThrottled}},
		{name: "throttled, error write refused, live read: same object → the write's error",
			answer: Published{Err: throttled, Throttled: true}, write: WriteRefused, live: Sighting{VA: fateVA()},
			wantRecord: PublishRecord{MayBePublished: true}, wantRead: true, want: Outcome{Kind: OutcomeWriteFailed}},

		// A final driver error: nothing was published, whatever became of
		// the VolumeAttachment.
		{name: "final error, recorded → failure, not terminal",
			answer: Published{Err: final, Final: true}, write: WriteSent,
			wantRecord: PublishRecord{}, want: Outcome{Kind: OutcomeFailed}},
		{name: "final error, error write NotFound → the write's error, no orphan",
			answer: Published{Err: final, Final: true}, write: WriteNotFound,
			wantRecord: PublishRecord{}, want: Outcome{Kind: OutcomeWriteFailed}},
		{name: "final error, already recorded → failure, no read",
			answer: Published{Err: final, Final: true}, write: WriteUnneeded,
			wantRecord: PublishRecord{}, want: Outcome{Kind: OutcomeFailed}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			rec, read, got := sc.run()
			if rec.Attached != sc.wantRecord.Attached || rec.MayBePublished != sc.wantRecord.MayBePublished || (rec.Blocked == nil) != (sc.wantRecord.Blocked == nil) {
				t.Errorf("AfterPublish = %+v, want %+v", rec, sc.wantRecord)
			}
			if rec.Blocked != nil && rec.Blocked.Reason != ReasonPublishContextTooLarge {
				t.Errorf("AfterPublish blocked by %s, want %s", rec.Blocked.Reason, ReasonPublishContextTooLarge)
			}
			if read != sc.wantRead {
				t.Errorf("live read made = %v, want %v", read, sc.wantRead)
			}
			if got != sc.want {
				t.Errorf("PublishOutcome = {%s uncertain=%v terminal=%v}, want {%s uncertain=%v terminal=%v}",
					got.Kind, got.Uncertain, got.Terminal, sc.want.Kind, sc.want.Uncertain, sc.want.Terminal)
			}
		})
	}
}

func TestWithCallFacts(t *testing.T) {
	secret := &v1.SecretReference{Namespace: "ns", Name: "s"}
	capErr := errors.New("map access modes [] to a CSI access mode: no access mode")
	publish := AttachPlan{Publish: true, NodeID: "n2", Volume: Volume{Handle: "vol-1", Secret: secret}}
	withUnpublish := publish
	withUnpublish.UnpublishFirst = &Unpublication{Handle: "vol-1", NodeID: "n1"}

	for _, tc := range []struct {
		name               string
		plan               AttachPlan
		facts              CallFacts
		wantPublish        Reason
		wantUnpublishFirst Reason
	}{
		{name: "secret read, capability built → both calls allowed", plan: withUnpublish, facts: CallFacts{Secret: secret}},
		{name: "secret missing → both calls wait for it", plan: withUnpublish, facts: CallFacts{Secret: secret, SecretState: SecretNotFound},
			wantPublish: ReasonWaitingForSecret, wantUnpublishFirst: ReasonWaitingForSecret},
		{name: "secret forbidden → both calls blocked", plan: withUnpublish, facts: CallFacts{Secret: secret, SecretState: SecretForbidden, SecretDenial: "forbidden"},
			wantPublish: ReasonSecretForbidden, wantUnpublishFirst: ReasonSecretForbidden},
		{name: "capability cannot be built → the publish is blocked, the unpublish (which sends none) is not", plan: withUnpublish, facts: CallFacts{Secret: secret, CapabilityErr: capErr},
			wantPublish: ReasonInvalidCapabilities},
		{name: "secret missing and capability unbuildable → the secret comes first", plan: publish, facts: CallFacts{Secret: secret, SecretState: SecretNotFound, CapabilityErr: capErr},
			wantPublish: ReasonWaitingForSecret},
		{name: "a plan that does not publish is left alone", plan: AttachPlan{Metadata: &MetadataChange{AddFinalizer: "f"}}, facts: CallFacts{Secret: secret, SecretState: SecretNotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := WithCallFacts(tc.plan, tc.facts)
			if r := reasonOrEmpty(got.PublishBlocked); r != tc.wantPublish {
				t.Errorf("PublishBlocked = %q, want %q", r, tc.wantPublish)
			}
			if got.UnpublishFirst != nil {
				if r := reasonOrEmpty(got.UnpublishFirst.Blocked); r != tc.wantUnpublishFirst {
					t.Errorf("UnpublishFirst.Blocked = %q, want %q", r, tc.wantUnpublishFirst)
				}
				if tc.plan.UnpublishFirst.Blocked != nil {
					t.Error("WithCallFacts changed the plan it was given")
				}
			}
		})
	}
}

func TestDetachWithCallFacts(t *testing.T) {
	secret := &v1.SecretReference{Namespace: "ns", Name: "s"}
	plan := DetachPlan{NodeID: "n1", Volume: Volume{Handle: "vol-1", Secret: secret}}
	if got := DetachWithCallFacts(plan, CallFacts{Secret: secret}); got.CallBlocked != nil {
		t.Errorf("secret read: CallBlocked = %v, want nil", got.CallBlocked)
	}
	if got := DetachWithCallFacts(plan, CallFacts{Secret: secret, SecretState: SecretNotFound, CapabilityErr: errors.New("x")}); reasonOrEmpty(got.CallBlocked) != ReasonWaitingForSecret {
		t.Errorf("secret missing: CallBlocked = %v, want %s", got.CallBlocked, ReasonWaitingForSecret)
	}
	if got := DetachWithCallFacts(plan, CallFacts{CapabilityErr: errors.New("x")}); got.CallBlocked != nil {
		t.Errorf("an unpublish sends no capability: CallBlocked = %v, want nil", got.CallBlocked)
	}
	done := DetachPlan{Done: true}
	if done.CallsDriver() || DetachWithCallFacts(done, CallFacts{Secret: secret, SecretState: SecretNotFound}).CallBlocked != nil {
		t.Error("a detach with nothing to do calls nothing and is not blocked")
	}
}

func reasonOrEmpty(b *Blocked) Reason {
	if b == nil {
		return ""
	}
	return b.Reason
}
