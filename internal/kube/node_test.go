package kube

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestNodeReady(t *testing.T) {
	cond := func(typ v1.NodeConditionType, s v1.ConditionStatus) v1.NodeCondition {
		return v1.NodeCondition{Type: typ, Status: s}
	}
	for _, tc := range []struct {
		name  string
		conds []v1.NodeCondition
		want  bool
	}{
		{"no conditions: not ready", nil, false},
		{"Ready True", []v1.NodeCondition{cond(v1.NodeMemoryPressure, v1.ConditionFalse), cond(v1.NodeReady, v1.ConditionTrue)}, true},
		{"Ready False", []v1.NodeCondition{cond(v1.NodeReady, v1.ConditionFalse)}, false},
		{"Ready Unknown (kubelet stopped reporting)", []v1.NodeCondition{cond(v1.NodeReady, v1.ConditionUnknown)}, false},
		{"only other conditions", []v1.NodeCondition{cond(v1.NodeDiskPressure, v1.ConditionTrue)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &v1.Node{Status: v1.NodeStatus{Conditions: tc.conds}}
			if got := NodeReady(n); got != tc.want {
				t.Errorf("NodeReady = %v, want %v", got, tc.want)
			}
		})
	}
}
