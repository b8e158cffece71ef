package state_test

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// alias is PV pv of volume handle h1 of driver d with the access modes.
func alias(pv string, modes ...v1.PersistentVolumeAccessMode) volume.Attachable {
	a := volume.NewAttachable("d", "h1")
	a.PVName, a.SpecName, a.AccessModes = pv, pv, modes
	return a
}

// Two PVs with one volume handle are one unique volume; the desired state
// keeps every spec its Pods name it by, not only the latest, so that
// multi-attach can look at all of them.
func TestDesiredAliasPVsOfOneHandle_everySpecKeptUntilItsPodGoes(t *testing.T) {
	rwo, rwx := alias("pv-rwo", v1.ReadWriteOnce), alias("pv-rwx", v1.ReadWriteMany)
	d := state.NewDesired()
	d.AddNode("n1", true)
	p1 := state.PodRef{Namespace: "ns", Name: "p1", UID: "u1"}
	p2 := state.PodRef{Namespace: "ns", Name: "p2", UID: "u2"}
	p3 := state.PodRef{Namespace: "ns", Name: "p3", UID: "u3"}
	d.AddPod(p1, "n1", []volume.Attachable{rwo})
	d.AddPod(p2, "n1", []volume.Attachable{rwx})
	d.AddPod(p3, "n1", []volume.Attachable{rwx})
	key := state.Key{Volume: rwo.UniqueName, Node: "n1"}

	w, ok := d.Get(key)
	if !ok || !reflect.DeepEqual(w.Specs, []volume.Attachable{rwo, rwx}) || w.Volume.PVName != "pv-rwx" {
		t.Fatalf("Get = %+v, %v; want both specs once, the latest as Volume", w, ok)
	}
	if got := d.VolumesOnNode("n1"); len(got) != 1 || !reflect.DeepEqual(got[0].Specs, w.Specs) {
		t.Fatalf("VolumesOnNode = %+v", got)
	}
	d.DeletePod(p1.UID)
	if w, _ := d.Get(key); !reflect.DeepEqual(w.Specs, []volume.Attachable{rwx}) {
		t.Fatalf("after the RWO Pod went: Specs = %+v, want only the RWX one", w.Specs)
	}
	// A Pod re-added with another resolution replaces its old spec.
	d.AddPod(p2, "n1", []volume.Attachable{rwo})
	if w, _ := d.Get(key); !reflect.DeepEqual(w.Specs, []volume.Attachable{rwo, rwx}) {
		t.Fatalf("after p2 moved to the RWO PV: Specs = %+v", w.Specs)
	}
}

// One Pod that names a volume handle through two PVs (one ReadWriteMany,
// one ReadWriteOnce) wants it once and keeps both specs, whatever their
// order in the Pod; the volume's spec is the RWO one in both orders (the
// most restrictive wins), and the Pod's leaving takes both with it.
func TestDesiredOnePodTwoSpecsOfOneHandle_bothKeptInEitherOrder(t *testing.T) {
	rwo, rwx := alias("pv-rwo", v1.ReadWriteOnce), alias("pv-rwx", v1.ReadWriteMany)
	p1 := state.PodRef{Namespace: "ns", Name: "p1", UID: "u1"}
	key := state.Key{Volume: rwo.UniqueName, Node: "n1"}
	for _, order := range [][]volume.Attachable{{rwx, rwo}, {rwo, rwx}, {rwx, rwo, rwx}} {
		d := state.NewDesired()
		d.AddNode("n1", true)
		if _, ok := d.AddPod(p1, "n1", order); !ok {
			t.Fatal("AddPod refused")
		}
		w, ok := d.Get(key)
		if !ok || !reflect.DeepEqual(w.Specs, []volume.Attachable{rwo, rwx}) || w.Volume.PVName != "pv-rwo" ||
			!reflect.DeepEqual(w.Pods, []state.PodRef{p1}) {
			t.Fatalf("order %s: Get = %+v, %v; want both specs, the RWO one as Volume, the Pod once", pvNames(order), w, ok)
		}
		if keys := d.DeletePod(p1.UID); !reflect.DeepEqual(keys, []state.Key{key}) {
			t.Fatalf("order %s: DeletePod = %v, want %v", pvNames(order), keys, key)
		}
		if _, ok := d.Get(key); ok {
			t.Fatalf("order %s: still wanted after its only Pod left", pvNames(order))
		}
		if got := d.NodesWantingVolume(rwo.UniqueName); len(got) != 0 {
			t.Fatalf("order %s: nodes wanting the volume after its Pod left = %v", pvNames(order), got)
		}
	}
}

func pvNames(specs []volume.Attachable) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.PVName)
	}
	return out
}
