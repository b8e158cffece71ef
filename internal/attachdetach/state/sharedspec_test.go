package state_test

import (
	"testing"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// The desired state holds each resolution once and shares it between the
// volume and its pods; what it returns and what it was given stay
// independent of it, in every way a caller can reach one.
func TestDesiredSharedSpec_callersNeverReachIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		// touch changes what a caller holds after AddPod.
		touch func(given []volume.Attachable, d *state.Desired)
	}{
		{"the caller changes the volumes it added the pod with", func(given []volume.Attachable, _ *state.Desired) {
			given[0].SpecName, given[0].PVName = "changed", "changed"
		}},
		{"the caller changes the Wanted it got", func(_ []volume.Attachable, d *state.Desired) {
			w, _ := d.Get(key("v1", "n1"))
			w.Volume.SpecName = "changed"
			w.Specs[0].PVName = "changed"
		}},
		{"the caller changes what VolumesOnNode returned", func(_ []volume.Attachable, d *state.Desired) {
			ws := d.VolumesOnNode("n1")
			ws[0].Volume.PVName = "changed"
			ws[0].Specs[0].SpecName = "changed"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := state.NewDesired()
			d.AddNode("n1", true)
			a := vol("v1")
			a.SpecName = a.PVName
			given := []volume.Attachable{a}
			if _, ok := d.AddPod(podA, "n1", given); !ok {
				t.Fatal("AddPod refused")
			}
			tc.touch(given, d)
			w, ok := d.Get(key("v1", "n1"))
			if !ok {
				t.Fatal("volume not wanted")
			}
			if w.Volume.PVName != "pv-v1" || w.Volume.SpecName != "pv-v1" || len(w.Specs) != 1 ||
				w.Specs[0].PVName != "pv-v1" || w.Specs[0].SpecName != "pv-v1" {
				t.Errorf("the state changed under its caller: %+v", w)
			}
		})
	}
}

// A second pod's resolution of the same volume is its own: the volume
// follows the latest, and each pod's spec leaves with that pod.
func TestDesiredSharedSpec_eachPodKeepsItsOwn(t *testing.T) {
	d := state.NewDesired()
	d.AddNode("n1", true)
	first, second := vol("v1"), vol("v1")
	first.SpecName, second.SpecName = "pv-a", "pv-b"
	d.AddPod(podA, "n1", []volume.Attachable{first})
	d.AddPod(podB, "n1", []volume.Attachable{second})
	w, _ := d.Get(key("v1", "n1"))
	if w.Volume.SpecName != "pv-b" || len(w.Specs) != 2 {
		t.Fatalf("with both pods: volume %q, %d specs; want pv-b, 2", w.Volume.SpecName, len(w.Specs))
	}
	d.DeletePod(podB.UID)
	w, _ = d.Get(key("v1", "n1"))
	if len(w.Specs) != 1 || w.Specs[0].SpecName != "pv-a" || len(w.Pods) != 1 || w.Pods[0] != podA {
		t.Errorf("after pod b left: %+v, want pod a with its spec pv-a", w)
	}
}
