package kube

import v1 "k8s.io/api/core/v1"

// NodeReady says whether node's Ready condition is True (false when it has
// none).
func NodeReady(node *v1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
