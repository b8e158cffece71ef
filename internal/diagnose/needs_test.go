package diagnose

import (
	"slices"
	"testing"

	"github.com/latchcsi/latch/internal/attacher"
)

// fetchLike does what package fetch does, with a complete snapshot standing
// in for the API server: read what Needs asks for until it asks nothing.
func fetchLike(target Target, server *Snapshot) *Snapshot {
	s := EmptySnapshot(server.Now)
	for round := 0; round < 10; round++ {
		needs := Needs(target, s)
		if len(needs) == 0 {
			return s
		}
		for _, ref := range needs {
			serve(server, s, ref)
		}
	}
	panic("Needs did not reach a fixed point in 10 rounds")
}

func serve(server, s *Snapshot, ref Ref) {
	k := key(ref.Namespace, ref.Name)
	switch ref.Kind {
	case RefPod:
		if o := server.Pods[k]; o != nil {
			s.Add(o)
		}
	case RefPVC:
		if o := server.PVCs[k]; o != nil {
			s.Add(o)
		}
	case RefPV:
		if o := server.PVs[k]; o != nil {
			s.Add(o)
		}
	case RefNode:
		if o := server.Nodes[k]; o != nil {
			s.Add(o)
		}
	case RefCSINode:
		if o := server.CSINodes[k]; o != nil {
			s.Add(o)
		}
	case RefCSIDriver:
		if o := server.CSIDrivers[k]; o != nil {
			s.Add(o)
		}
	case RefPodList:
		for _, p := range server.Pods {
			if p != nil && p.Namespace == ref.Namespace {
				s.Add(p)
			}
		}
	case RefVAList:
		for _, va := range server.VAs {
			s.Add(va)
		}
	case RefLeaseList:
		for _, l := range server.Leases[ref.Name] {
			s.Add(l)
		}
	case RefEventList:
		for _, e := range server.Events[eventKey(ref.Of, ref.Namespace, ref.Name)] {
			s.Add(e)
		}
	}
	s.MarkRead(ref)
}

func TestNeedsStartsFromTheTargetAndFollowsOneLinkPerRound(t *testing.T) {
	s := EmptySnapshot(now)
	got := Needs(podWeb, s)
	want := []Ref{{Kind: RefPod, Namespace: ns, Name: "web"}}
	if !slices.Equal(got, want) {
		t.Fatalf("first round = %v, want %v", got, want)
	}
	server := NewSnapshot(now, healthy()...)
	serve(server, s, got[0])
	got = Needs(podWeb, s)
	if !slices.Contains(got, Ref{Kind: RefPVC, Namespace: ns, Name: "data"}) {
		t.Fatalf("second round = %v, want the Pod's PVC", got)
	}
	if slices.ContainsFunc(got, func(r Ref) bool { return r.Kind == RefPV }) {
		t.Fatalf("second round = %v: the PV is not known before the PVC is read", got)
	}
}

func TestNeedsStopsAtAMissingTarget(t *testing.T) {
	s := EmptySnapshot(now)
	s.MarkRead(Ref{Kind: RefPod, Namespace: ns, Name: "web"})
	if got := Needs(podWeb, s); len(got) != 0 {
		t.Fatalf("Needs after the Pod was not found = %v, want nothing", got)
	}
}

func TestNeedsTreatsUnreadableAsAnswered(t *testing.T) {
	s := EmptySnapshot(now)
	s.Unreadable[Ref{Kind: RefPod, Namespace: ns, Name: "web"}] = "forbidden"
	if got := Needs(podWeb, s); len(got) != 0 {
		t.Fatalf("Needs = %v, want nothing once the read was refused", got)
	}
	checkExpect(t, Explain(podWeb, s), expect{"pod.exists", StatusInfo, []string{"could not read", "forbidden"}})
}

// The annotation is copied, not imported; this keeps the copies equal.
func TestVolumeHandleAnnotationMatchesTheAttacher(t *testing.T) {
	if annVolumeHandle != attacher.AnnVolumeHandle {
		t.Fatalf("annVolumeHandle = %q, attacher uses %q", annVolumeHandle, attacher.AnnVolumeHandle)
	}
}
