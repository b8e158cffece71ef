package kubelet_test

import (
	"context"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// The API history the package's tests read: every change of Nodes,
// VolumeAttachments and the Pods of the rig's namespace, recorded by
// kubeletorder (shared with test/e2e/attachdetach) under the package's
// short names.

type change = kubeletorder.Change

type history struct{ *kubeletorder.History }

func recordHistory(t *testing.T, ctx context.Context, client kubernetes.Interface, ns string) *history {
	t.Helper()
	return &history{kubeletorder.Record(t, ctx, client, ns)}
}

// first is the earliest recorded change (by RV) that match accepts.
func (h *history) first(match func(change) bool) (change, bool) { return h.First(match) }

// mustFirst is first that fails the test, waiting up to
// kubeletorder.RecordLag (30 s) for the watch to record the change.
func (h *history) mustFirst(t *testing.T, what string, match func(change) bool) change {
	t.Helper()
	return h.MustFirst(t, what, match)
}

var (
	vaNamed   = kubeletorder.VANamed
	podNamed  = kubeletorder.PodNamed
	nodeNamed = kubeletorder.NodeNamed
	inUse     = kubeletorder.InUse
	after     = kubeletorder.After
)
