package csimock

import (
	"fmt"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

func TestConcurrentPublishOfASingleNodeVolumeAttachesOnce(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	const nodes = 20
	results := make(chan codes.Code, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", fmt.Sprintf("node-%d", i), csitest.SNW))
			results <- status.Code(err)
		})
	}
	wg.Wait()
	close(results)
	won := 0
	for c := range results {
		switch c {
		case codes.OK:
			won++
		case codes.FailedPrecondition:
		default:
			t.Fatalf("unexpected code %s", c)
		}
	}
	st := e.d.Stats().Publish
	if won != 1 || len(e.d.Published("vol-1")) != 1 || st.SingleNodeViolationsTotal != 0 || st.SingleNodeConflictAttemptsTotal != nodes-1 || st.MaxSingleNodePublishedNodes != 1 {
		t.Fatalf("won=%d published=%v stats=%+v", won, e.d.Published("vol-1"), st)
	}
}

func TestDecidePublish(t *testing.T) {
	pub := func(node string, mode csi.VolumeCapability_AccessMode_Mode) *publication {
		return &publication{NodeID: node, Capability: csitest.Mount(mode, "")}
	}
	args := publishArgs{VolumeID: "v", NodeID: "n", Capability: csitest.Mount(csitest.SNW, "")}
	tests := []struct {
		name    string
		args    publishArgs
		view    publishView
		verdict publishVerdict
		code    codes.Code
	}{
		{"decide: volume missing, no auto-create → NotFound", args, publishView{NodeKnown: true}, publishReject, codes.NotFound},
		{"decide: volume missing, auto-create → new", args, publishView{AutoCreate: true, NodeKnown: true}, publishNew, codes.OK},
		{"decide: node unknown beats everything but the volume → NotFound", args, publishView{VolumeExists: true}, publishReject, codes.NotFound},
		{"decide: compatible repeat at the limit → again", args, publishView{VolumeExists: true, NodeKnown: true, Existing: pub("n", csitest.SNW), NodeCount: 1, MaxVolumesPerNode: 1}, publishAgain, codes.OK},
		{"decide: single-node conflict is reported before the attach limit", args, publishView{VolumeExists: true, NodeKnown: true, Others: []*publication{pub("m", csitest.SNW)}, NodeCount: 9, MaxVolumesPerNode: 1}, publishReject, codes.FailedPrecondition},
		{"decide: multi-node beside multi-node → new", publishArgs{VolumeID: "v", NodeID: "n", Capability: csitest.Mount(csitest.MNMW, "")}, publishView{VolumeExists: true, NodeKnown: true, Others: []*publication{pub("m", csitest.MNMW)}}, publishNew, codes.OK},
		{"decide: conflict skipped → new (recorded by the caller)", args, publishView{VolumeExists: true, NodeKnown: true, Others: []*publication{pub("m", csitest.SNW)}, SkipSingleNodeCheck: true}, publishNew, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := decidePublish(tc.args, tc.view)
			if v != tc.verdict || status.Code(err) != tc.code {
				t.Fatalf("decidePublish = %v, %v; want %v, %s", v, err, tc.verdict, tc.code)
			}
		})
	}
}

// BenchmarkPublishUnpublish measures one publish + unpublish round trip
// over the unix socket, spread over many volumes and nodes.
func BenchmarkPublishUnpublish(b *testing.B) {
	cfg := DefaultConfig()
	cfg.AutoCreateVolumes = true
	cfg.CallLogSize = 1000
	e := newEnv(b, cfg)
	ctx := testCtx(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			vol, node := fmt.Sprintf("vol-%p-%d", pb, i), fmt.Sprintf("node-%d", i%100)
			if _, err := e.ctrl.ControllerPublishVolume(ctx, pubReq(vol, node, csitest.SNW)); err != nil {
				b.Fatal(err)
			}
			if _, err := e.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: node}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
