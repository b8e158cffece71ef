package kubelet_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestKubeletAttachLimitWithoutScheduler: the node's driver reports
// max_volumes_per_node 1 (the kubelet writes it as the CSINode's
// allocatable count). A second Pod with another volume is put on the
// node by spec.nodeName, as nothing schedules: the kubelet admits it
// (its admission does not check CSI volume limits), the attach/detach
// controller asks for the attach, and the driver refuses
// ControllerPublish with ResourceExhausted — the VolumeAttachment reports
// the attach error, the Pod gets a FailedAttachVolume warning and waits,
// never staged. When the first Pod
// goes, its volume is detached in order and the waiting volume is
// attached and mounted: the limit is only the driver's.
func TestKubeletAttachLimitWithoutScheduler(t *testing.T) {
	r := newRig(t, 5*time.Minute, rigOptions{Mock: slowPublishAndUnstage})
	n := r.addNode("a", 1)
	testsupport.Eventually(t, r.ctx, 30*time.Second, "CSINode "+n.Name+" allocatable count 1", func(ctx context.Context) (bool, error) {
		d, err := r.csiNodeDriver(ctx, n.Name)
		if err != nil || d == nil || d.Allocatable == nil || d.Allocatable.Count == nil {
			return false, err
		}
		if *d.Allocatable.Count != 1 {
			t.Fatalf("CSINode %s allocatable count %d, want 1 (NodeGetInfo's max_volumes_per_node)", n.Name, *d.Allocatable.Count)
		}
		return true, nil
	})
	first, second := r.volume("first"), r.volume("second")
	r.pod("first", n, first)
	r.waitPodRunning("first", 90*time.Second)
	r.checkAttach(first, n, "first")

	r.pod("second", n, second)
	testsupport.Eventually(t, r.ctx, 60*time.Second, "VolumeAttachment of "+second+" reports ResourceExhausted", func(ctx context.Context) (bool, error) {
		va, ok, err := r.getVA(ctx, second, n)
		return ok && va.Status.AttachError != nil && strings.Contains(va.Status.AttachError.Message, "ResourceExhausted"), err
	}, r.dumpCalls)
	r.consistently("Pod second waits, "+second+" unattached and never staged", 4*time.Second, func(ctx context.Context) (string, error) {
		p, ok, err := r.getPod(ctx, "second")
		if err != nil {
			return "", err
		}
		switch {
		case !ok:
			return "Pod second gone", nil
		case p.Status.Phase != v1.PodPending:
			return "Pod second " + string(p.Status.Phase), nil
		}
		va, _, err := r.getVA(ctx, second, n)
		if err == nil && va.Status.Attached {
			return second + " attached", nil
		}
		for _, c := range r.s.Driver.NodeCalls(n.id) {
			if c.VolumeID == second {
				return c.Method + " of " + second, nil
			}
		}
		return "", err
	})
	ok, err := r.hasEvent(r.ctx, "second", "FailedAttachVolume", "ResourceExhausted")
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Errorf("no FailedAttachVolume event naming ResourceExhausted on Pod second")
	}

	r.deletePod("first")
	r.waitDetached(first, n, 2*time.Minute)
	r.checkDetach(first, n)
	r.waitPodRunning("second", 2*time.Minute)
	r.checkAttach(second, n, "second")
	if c, ok := findNodeCall(r.s.Driver.Calls(), "ControllerPublishVolume", second, n.id, codes.ResourceExhausted); !ok {
		t.Errorf("no ControllerPublish of %s refused with ResourceExhausted", second)
	} else {
		t.Logf("refused: %s", c.Message)
	}
	r.deletePod("second")
	r.waitDetached(second, n, 2*time.Minute)
	r.checkDetach(second, n)
}
