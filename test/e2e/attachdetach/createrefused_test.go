package attachdetach_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/diagnose"
	"github.com/latchcsi/latch/internal/diagnose/fetch"
	"github.com/latchcsi/latch/internal/testsupport"
)

// A ValidatingAdmissionPolicy (with its binding) denies the creates of one
// volume's VolumeAttachments. The controller's create is refused: the Pod
// gets a Warning FailedAttachVolume event with kube-controller-manager's
// reason and text carrying the API server's answer, the refusals are
// counted by reason, latchctl names the policy, and the create is retried
// with backoff. Once the binding is deleted, the volume attaches and the
// Pod runs.
func TestCreateRefused_admissionPolicyDeniesTheVolumeAttachment_podToldThenAttachedOncePolicyGoes(t *testing.T) {
	const start = 100 * time.Millisecond
	e := newEnv(t, controller.Config{Workers: 4, RetryIntervalStart: start, RetryIntervalMax: 2 * time.Second})
	node := e.addNode("n1")
	pv := e.volume("frozen", rwo())
	policy, binding := e.prefix+"-freeze", e.prefix+"-freeze-binding"
	e.denyVolumeAttachmentsOf(pv, policy, binding)

	// What the API server answers any client's create of that
	// VolumeAttachment, once the policy is in force (a policy's denial is
	// 422 Invalid unless its validation names another reason).
	var (
		answer string
		status metav1.Status
	)
	e.eventually("the policy refuses the VolumeAttachment", func() (bool, error) {
		src := pv
		va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: e.vaName(pv, node)},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: e.driver, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &src}}}
		_, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		var apiErr apierrors.APIStatus
		if !errors.As(err, &apiErr) {
			return false, nil
		}
		answer, status = err.Error(), apiErr.Status()
		return true, nil
	})
	t.Logf("the API server refuses the create: %d %s: %s", status.Code, status.Reason, answer)
	if !strings.Contains(answer, "ValidatingAdmissionPolicy '"+policy+"' with binding '"+binding+"' denied request") {
		t.Fatalf("the API server's answer %q does not name the policy and binding", answer)
	}

	e.pod("app", node, pv)
	// kube-controller-manager's text: the operation generator's
	// "AttachVolume.Attach failed for volume %q : %v" around its CSI
	// attacher's "kubernetes.io/csi: attacher.Attach failed: <answer>".
	want := fmt.Sprintf("AttachVolume.Attach failed for volume %q : kubernetes.io/csi: attacher.Attach failed: %s", pv, answer)
	e.waitEvent("app", "FailedAttachVolume", want)
	for _, ev := range e.events("app", "FailedAttachVolume") {
		if ev.Type != v1.EventTypeWarning || ev.InvolvedObject.Kind != "Pod" {
			t.Errorf("event %s %s on %+v, want a Warning on the Pod", ev.Type, ev.Reason, ev.InvolvedObject)
		}
	}

	e.eventually("six refused creates", func() (bool, error) { return len(e.refusedCreatesAt(int(status.Code))) >= 6, nil })
	if _, ok := e.getVA(e.vaName(pv, node)); ok {
		t.Fatal("a VolumeAttachment exists although every create was refused")
	}
	// Retried with backoff: after at most one retry at once (the first
	// pass's own wake-up), the waits grow.
	at := e.refusedCreatesAt(int(status.Code))
	short := 0
	for i := 1; i < len(at); i++ {
		if at[i].Sub(at[i-1]) < start/2 {
			short++
		}
	}
	if last := at[len(at)-1].Sub(at[len(at)-2]); short > 1 || last < 4*start {
		t.Errorf("refused creates at %v: want at most one retry at once and the wait grown to %v, got last %v", at, 4*start, last)
	}
	e.eventually(fmt.Sprintf("every refused create counted with reason %s", status.Reason), func() (bool, error) {
		got, err := testutil.GetCounterValuesFromGatherer(e.registry, controller.CreateErrorsMetric, map[string]string{"driver": e.driver}, "reason")
		return err == nil && got[string(status.Reason)] == float64(len(e.refusedCreatesAt(int(status.Code)))) && len(got) == 1, nil
	})

	// latchctl, against the API server, names the policy.
	snap, err := fetch.Snapshot(e.ctx, e.client, diagnose.Target{Kind: diagnose.TargetPod, Namespace: e.ns, Name: "app"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	report := diagnose.Explain(diagnose.Target{Kind: diagnose.TargetPod, Namespace: e.ns, Name: "app"}, snap)
	found := false
	for _, f := range report.Findings {
		if f.Check == "va.createRefused" && f.Status == diagnose.StatusProblem && strings.Contains(f.Message, "is frozen") &&
			strings.Contains(f.Hint, "ValidatingAdmissionPolicy "+policy) && strings.Contains(f.Hint, binding) {
			found = true
		}
	}
	if !found {
		t.Errorf("latchctl explain pod: no problem va.createRefused naming the policy; findings %+v", report.Findings)
	}

	if err := e.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(e.ctx, binding, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAttachedVA(pv, node)
	e.waitPodRunning("app")
	e.waitNodeAttached(node, e.unique(pv))
}

// denyVolumeAttachmentsOf makes a ValidatingAdmissionPolicy called policy
// and its binding that deny every create of a VolumeAttachment of PV pv,
// and deletes both when the test ends.
func (e *env) denyVolumeAttachmentsOf(pv, policy, binding string) {
	e.t.Helper()
	remove, err := testsupport.DenyVolumeAttachmentsOf(e.ctx, e.client, pv, policy, binding)
	e.t.Cleanup(func() { remove(context.WithoutCancel(e.ctx)) })
	if err != nil {
		e.t.Fatal(err)
	}
}

// refusedCreatesAt returns when the controllers' VolumeAttachment creates
// answered with code came back, in order.
func (e *env) refusedCreatesAt(code int) []time.Time {
	var out []time.Time
	for _, w := range e.ctrlAPI.Writes() {
		if isVACreate(w) && w.Code == code {
			out = append(out, w.At)
		}
	}
	return out
}
