package attachdetach_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
)

// The order check must be able to fail. A node's kubelet stops with a
// volume mounted, the Pod is force-deleted, and another client clears
// the node's volumesInUse (what the stand-in version of
// TestCSIDriverChange_attachRequiredFalse_... did to play an unmount):
// the controller detaches a volume that is still staged and published.
// CheckDetach reports each of that.
func TestKubeletOrderCheck_reportsTheDetachOfAMountedVolume(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	node, pv, _ := e.runningPod("mounted")
	e.stopKubeletOf(node)
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	e.waitPodGone("app")
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": []v1.UniqueVolumeName{}}})
	if _, err := e.client.CoreV1().Nodes().Patch(e.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	e.eventually("VolumeAttachment of "+pv+" on "+node+" deleted", func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return !ok, nil
	})

	rec := &recordingTB{TB: t}
	e.real.checked[[2]string{pv, e.nodeID(node)}] = true
	e.real.order.CheckDetach(rec, pv, node, e.nodeID(node))
	for _, want := range []string{
		pv + " was NodePublished on " + e.nodeID(node) + " but never NodeUnpublished",
		pv + " was NodeStaged on " + e.nodeID(node) + " but never NodeUnstaged",
		"node " + e.nodeID(node) + " still holds " + pv,
	} {
		if !rec.reported(want) {
			t.Errorf("CheckDetach did not report %q; it reported:\n%s", want, strings.Join(rec.errs, "\n"))
		}
	}
}

// recordingTB keeps the errors a check reports instead of failing the
// test; a Fatalf (the check could not run) still fails it.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.TB.Helper()
	r.TB.Fatalf("the check could not run: "+format, args...)
}

func (r *recordingTB) reported(prefix string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}
