package latchlocal

import (
	"context"
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// The README's first command runs this demo; the test runs the same code
// in-process and checks that every milestone happened, in order.
func TestDemoWalksAttachConflictAndDetachInOrder(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, Options{Nodes: 2})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer env.Stop()

	r := RunDemo(ctx, env, nopReporter{})
	if !r.OK {
		t.Fatalf("demo failed at %q: %s", r.FailedStep, r.Error)
	}
	var got []string
	for _, s := range r.Steps {
		got = append(got, s.Phase+": "+s.Name)
	}
	want := []string{
		"attach: PV and PVC created",
		"attach: Pod app-1 created",
		"attach: VolumeAttachment created",
		"attach: ControllerPublishVolume succeeded",
		"attach: VolumeAttachment attached",
		"attach: node status updated",
		"attach: Pod Running",
		"multi-attach: Pod app-2 created",
		"multi-attach: Multi-Attach error reported on app-2",
		"multi-attach: no publish to node-2 while node-1 holds the volume",
		"detach: Pod app-1 deleted",
		"detach: kubelet released the volume (volumesInUse)",
		"detach: ControllerUnpublishVolume succeeded",
		"detach: VolumeAttachment deleted",
		"detach: node status updated",
		"conflict resolved: VolumeAttachment created",
		"conflict resolved: ControllerPublishVolume succeeded",
		"conflict resolved: VolumeAttachment attached",
		"conflict resolved: node status updated",
		"conflict resolved: Pod Running",
		"cleanup: Pod app-2 deleted",
		"cleanup: VolumeAttachment deleted",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("steps:\n%q\nwant:\n%q", got, want)
	}
	for i := 1; i < len(r.Steps); i++ {
		if r.Steps[i].At < r.Steps[i-1].At {
			t.Errorf("step %q observed before the step before it", r.Steps[i].Name)
		}
	}
	// Exactly one publish per node: the conflict never reached the driver.
	if n := len(env.Driver.CallsTo("ControllerPublishVolume")); n != 2 {
		t.Errorf("ControllerPublish calls = %d, want 2 (node-1, then node-2 after the release)", n)
	}
	if v := env.Driver.Stats().Publish.SingleNodeConflictAttemptsTotal; v != 0 {
		t.Errorf("driver saw %d attempts to publish the RWO volume to a second node", v)
	}
}

type nopReporter struct{}

func (nopReporter) Phase(string)   {}
func (nopReporter) Waiting(string) {}
func (nopReporter) Step(Step)      {}
