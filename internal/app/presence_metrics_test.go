package app

import (
	"context"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2/ktesting"
)

// A Presence without a gauge works as one with a gauge and registers
// nothing in component-base's process-wide registry: the gauge is the
// binary's, registered with the binary's registry (csi-attacher's
// latch_attacher_competing_instances is made by attacher.Metrics), so two
// attachers in one process never register it twice.
func TestPresenceWithoutGaugeWorksAndRegistersNothingGlobally(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	ran := false
	err := RunAsLeader(ctx, client, presenceConfig("a", nil), nil, func(context.Context) error {
		ran = true
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("RunAsLeader = %v, ran %v; want the work run and nil", err, ran)
	}
	if h := holder(t, ctx, client); h != "a" && h != "" {
		t.Errorf("Lease holder = %q, want a (or released)", h)
	}
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "latch_attacher_competing_instances" {
			t.Errorf("the legacy registry holds %s: package app registered it itself", f.GetName())
		}
	}
}
