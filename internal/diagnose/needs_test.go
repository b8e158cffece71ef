package diagnose

import (
	"iter"
	"maps"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

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

// serve answers one read from the server's snapshot into s, as the API
// server would.
func serve(server, s *Snapshot, ref Ref) {
	k := key(ref.Namespace, ref.Name)
	answer := map[RefKind]func(){
		RefPod:       func() { addFound(s, server.Pods, k) },
		RefPVC:       func() { addFound(s, server.PVCs, k) },
		RefPV:        func() { addFound(s, server.PVs, k) },
		RefNode:      func() { addFound(s, server.Nodes, k) },
		RefCSINode:   func() { addFound(s, server.CSINodes, k) },
		RefCSIDriver: func() { addFound(s, server.CSIDrivers, k) },
		RefPodList: func() {
			for _, p := range server.Pods {
				if p != nil && p.Namespace == ref.Namespace {
					s.Add(p)
				}
			}
		},
		RefAttacherPodList: func() {
			for _, p := range server.Pods {
				if p != nil && IsAttacherPod(p) {
					s.Add(p)
				}
			}
		},
		RefVAList:    func() { addAll(s, maps.Values(server.VAs)) },
		RefLeaseList: func() { addAll(s, slices.Values(server.Leases[ref.Name])) },
		RefEventList: func() { addAll(s, slices.Values(server.Events[eventKey(ref.Of, ref.Namespace, ref.Name)])) },
	}
	if read, ok := answer[ref.Kind]; ok {
		read()
	}
	s.MarkRead(ref)
}

// addFound adds the object the server holds under k, if it holds one (a
// nil entry is a "not found" the server remembers).
func addFound[T interface {
	comparable
	runtime.Object
}](s *Snapshot, server map[string]T, k string) {
	var none T
	if o := server[k]; o != none {
		s.Add(o)
	}
}

func addAll[T runtime.Object](s *Snapshot, objs iter.Seq[T]) {
	for o := range objs {
		s.Add(o)
	}
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
