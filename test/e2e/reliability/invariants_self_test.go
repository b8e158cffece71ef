package reliability_test

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/csimock"
)

// The checker must be able to fail: a publication nobody asked for and a
// single-node volume on two nodes are reported. (The regression test of an
// exclusive volume moving nodes shows invariant 3 firing on a real bug.)
func TestInvariantChecker_reportsLeakedAndDoublePublications(t *testing.T) {
	e := newEnv(t, options{noController: true})
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	rwo := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol := e.prefix + "-leak"
	if err := e.mock.SeedVolume(csimock.VolumeSpec{ID: vol}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{n1, n2} {
		if _, err := e.mock.SeedPublication(vol, e.nodeID(n), false, rwo); err != nil {
			t.Fatal(err)
		}
	}
	w, err := e.read()
	if err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(e.restProblems(w), "\n")
	for _, n := range []string{n1, n2} {
		if !strings.Contains(problems, "invariant 2: the driver still has "+vol+" published to \""+n+"\"") {
			t.Errorf("leaked publication on %s not reported; problems:\n%s", n, problems)
		}
	}
	if p := e.mock.Stats().Publish; p.SingleNodeViolationsTotal != 1 {
		t.Errorf("the driver recorded %d single-node violations, want 1 (what invariant 3 reads)", p.SingleNodeViolationsTotal)
	}
}

// Invariant 7 must be able to fail: a Pod whose volume is not attached on
// its node, with nothing that says why, is reported; a FailedAttachVolume
// event of the attach/detach controller on that Pod explains it.
func TestInvariantChecker_reportsAPodWaitingWithoutAReason(t *testing.T) {
	e := newEnv(t, options{noController: true})
	n1 := e.addNode("n1")
	pv := e.volume("v")
	e.pod("p", n1, pv)
	pod, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := "invariant 7: Pod p wants " + pv + " on " + n1
	problems := func() string {
		w, err := e.read()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(e.restProblems(w), "\n")
	}
	if got := problems(); !strings.Contains(got, want) {
		t.Errorf("a Pod waiting without a reason not reported; problems:\n%s", got)
	}
	ev := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: e.ns, Name: "p.multiattach"},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: e.ns, Name: "p", UID: pod.UID},
		Reason:         decide.ReasonFailedAttachVolume, Type: v1.EventTypeWarning,
		Message: decide.MultiAttachMessage(pv, state.PodRef{Namespace: e.ns, Name: "p", UID: pod.UID}, nil),
		Source:  v1.EventSource{Component: controller.EventComponent},
	}
	if _, err := e.client.CoreV1().Events(e.ns).Create(e.ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := problems(); strings.Contains(got, "invariant 7") {
		t.Errorf("a Pod told why it waits still reported; problems:\n%s", got)
	}
}
