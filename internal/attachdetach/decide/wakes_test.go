package decide_test

import (
	"testing"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
)

func TestPlanWakes(t *testing.T) {
	tests := []struct {
		name    string
		plan    decide.Plan
		applied bool
		want    decide.Wakes
	}{
		{"the actual state changed → the volume's other nodes and the node status", decide.Plan{Kind: decide.KindMarkAttached}, true, decide.Wakes{Volume: true, NodeStatus: true}},
		{"nothing changed → nothing to wake", decide.Plan{Kind: decide.KindWait}, false, decide.Wakes{}},
		{"detach held back for the node status, entry already detaching → the node status alone", decide.Plan{Kind: decide.KindWaitForNodeStatus, WakeNodeStatus: true}, false, decide.Wakes{NodeStatus: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.plan.Wakes(tt.applied); got != tt.want {
				t.Errorf("Wakes(%v) = %+v, want %+v", tt.applied, got, tt.want)
			}
		})
	}
}
