package bench

import (
	"slices"
	"testing"
)

// --workloads keeps of each contender the workloads named and leaves out
// a contender with none left, and the controllers unless named.
func TestPeerWorkloadsKeepsTheNamedWorkloads(t *testing.T) {
	attachers := []PeerAttacher{
		{Name: "both", Latency: true, Backends: true},
		{Name: "latency only", Latency: true},
		{Name: "backends only", Backends: true},
	}
	controllers := []PeerController{{Name: "kcm"}}
	names := func(as []PeerAttacher) []string {
		var n []string
		for _, a := range as {
			n = append(n, a.Name)
		}
		return n
	}
	as, cs := PeerWorkloads(attachers, controllers, []string{"backends"})
	if got := names(as); !slices.Equal(got, []string{"both", "backends only"}) || as[0].Latency || !as[0].Backends || cs != nil {
		t.Errorf("backends: attachers %v (first %+v), controllers %v; want both and backends only, without latency, no controllers", got, as[0], cs)
	}
	as, cs = PeerWorkloads(attachers, controllers, []string{"latency", " controllers"})
	if got := names(as); !slices.Equal(got, []string{"both", "latency only"}) || as[0].Backends || len(cs) != 1 {
		t.Errorf("latency,controllers: attachers %v, controllers %v; want both and latency only, without backends, and kcm", got, cs)
	}
	as, cs = PeerWorkloads(attachers, controllers, []string{"latency", "backends", "controllers"})
	if len(as) != 3 || len(cs) != 1 || !as[0].Latency || !as[0].Backends {
		t.Errorf("all: attachers %+v, controllers %v; want everything", as, cs)
	}
}

// latch fixed runs the backend profiles only, and the latency workload too
// with FixedLatency (--fixed-latency); latch adaptive runs both always.
func TestPeerContendersRunLatchFixedInTheLatencyWorkloadOnlyWhenAsked(t *testing.T) {
	for _, fixedLatency := range []bool{false, true} {
		attachers, _, _, err := PeerContenders(PeerContenderOptions{LatchAttacher: "csi-attacher", LatchController: "attachdetach-controller", FixedLatency: fixedLatency})
		if err != nil {
			t.Fatal(err)
		}
		as, _ := PeerWorkloads(attachers, nil, []string{"latency"})
		var got []string
		for _, a := range as {
			got = append(got, a.Name)
		}
		want := []string{PeerLatchAdaptive}
		if fixedLatency {
			want = append(want, PeerLatchFixed)
		}
		if !slices.Equal(got, want) {
			t.Errorf("FixedLatency=%v: the latency workload runs %v, want %v", fixedLatency, got, want)
		}
	}
}
