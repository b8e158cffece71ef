package csimock

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// A NextToken fault makes ListVolumes paging endless: every page lists the
// first volumes again and hands back a token the driver takes back, a new
// one every call (fresh) or always the same (repeat). Without the fault
// the same listing ends.
func TestFaultNextTokenMakesListVolumesPagingEndless(t *testing.T) {
	for _, f := range []NextTokenFault{NextTokenFresh, NextTokenRepeat} {
		t.Run(string(f), func(t *testing.T) {
			e := newEnv(t, DefaultConfig())
			e.seed(t, "vol-1", "vol-2", "vol-3")
			id, err := e.d.AddFault(Rule{Method: "ListVolumes", NextToken: f})
			if err != nil {
				t.Fatal(err)
			}
			token := ""
			var tokens []string
			for range 5 {
				rsp, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
				if err != nil {
					t.Fatalf("ListVolumes(token %q): %v", token, err)
				}
				if len(rsp.Entries) != 2 || rsp.Entries[0].GetVolume().GetVolumeId() != "vol-1" {
					t.Fatalf("page = %v, want the first two volumes", rsp.Entries)
				}
				token = rsp.GetNextToken()
				tokens = append(tokens, token)
			}
			distinct := map[string]bool{}
			for _, tok := range tokens {
				distinct[tok] = true
			}
			if want := map[NextTokenFault]int{NextTokenFresh: 5, NextTokenRepeat: 1}[f]; len(distinct) != want {
				t.Errorf("tokens %q: %d distinct, want %d", tokens, len(distinct), want)
			}
			if fs := e.d.Faults(); len(fs) != 1 || fs[0].Fired != 5 {
				t.Errorf("Faults() = %+v, want the rule fired 5 times", fs)
			}
			e.d.RemoveFault(id)
			pages := 0
			for token = ""; ; pages++ {
				rsp, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
				if err != nil {
					t.Fatal(err)
				}
				if token = rsp.GetNextToken(); token == "" {
					break
				}
			}
			if pages != 1 {
				t.Errorf("listing without the fault took %d further pages, want 1", pages)
			}
		})
	}
	if _, err := newEnv(t, DefaultConfig()).d.AddFault(Rule{Method: "ControllerPublishVolume", NextToken: NextTokenFresh}); err == nil {
		t.Error("a nextToken rule on another method must be rejected")
	}
}
