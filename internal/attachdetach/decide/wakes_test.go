package decide_test

import (
	"testing"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
)

func TestPlanWakes(t *testing.T) {
	attaching := entry(state.StateAttaching, false, true)
	attached := entry(state.StateAttached, true, true)
	tests := []struct {
		name    string
		plan    decide.Plan
		before  *state.Attachment
		applied bool
		want    decide.Wakes
	}{
		{"the actual state changed → the volume's other nodes and the node status", decide.Plan{Kind: decide.KindMarkAttached, Actual: upd(state.StateAttached, true, t0, nil)}, attaching, true, decide.Wakes{Volume: true, NodeStatus: true}},
		{"nothing changed → nothing to wake", decide.Plan{Kind: decide.KindWait}, attaching, false, decide.Wakes{}},
		{"detach held back for the node status, entry already detaching → the node status alone", decide.Plan{Kind: decide.KindWaitForNodeStatus, WakeNodeStatus: true}, nil, false, decide.Wakes{NodeStatus: true}},
		{"entry recorded attaching, not in the node's list → the volume's other nodes only", decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, t0, nil)}, nil, true, decide.Wakes{Volume: true}},
		{"reported entry forgotten → the node status too", decide.Plan{Kind: decide.KindForget, Actual: &state.Update{Remove: true}}, attached, true, decide.Wakes{Volume: true, NodeStatus: true}},
		{"unreported entry forgotten → the volume's other nodes only", decide.Plan{Kind: decide.KindForget, Actual: &state.Update{Remove: true}}, attaching, true, decide.Wakes{Volume: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.plan.Wakes(tt.before, tt.applied); got != tt.want {
				t.Errorf("Wakes(%v) = %+v, want %+v", tt.applied, got, tt.want)
			}
		})
	}
}
