package interop

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// attachTimeout is kube-controller-manager's csiTimeout, a constant: the
// test lasts a little over it.
const attachTimeout = 2 * time.Minute

// A Pod whose volume's driver no attacher serves: kube-controller-manager
// and latch's attach/detach controller each create the VolumeAttachment,
// and 2 minutes later record the same Warning FailedAttachVolume "timed
// out waiting for external-attacher of <driver> CSI driver to attach
// volume <handle>" on the Pod. Both worlds run at once, beside the other
// parallel tests (the matrix): the 2 minutes are waiting.
func TestNoAttacher_kcmAndLatchRecordTheSameTimeoutEvent(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[adKind]string{}
	for _, ad := range []adKind{kcmAD, latchAD} {
		t.Run(string(ad), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			var nodes []localcluster.NodeConfig
			for _, n := range worldNodes {
				nodes = append(nodes, localcluster.NodeConfig{Name: n})
			}
			w := startWorld(t, ctx, pair{ad: ad, at: "none"}, stack.Options{Driver: driver, Attacher: stack.AttacherNone, NoController: true, Nodes: nodes})
			w.ctrl = w.startController(ad, controllerOptions{})
			ns := w.namespace("noattacher")
			pv := w.volume(ns, "pv-1")
			w.pod(ns, "app", "node-a", pv)
			var created time.Time
			w.eventually("the VolumeAttachment created", func(context.Context) (bool, error) {
				va, ok := w.getVA(vaName(pv, "node-a"))
				if ok {
					created = va.CreationTimestamp.Time
				}
				return ok, nil
			})
			want := fmt.Sprintf("AttachVolume.Attach failed for volume %q : timed out waiting for external-attacher of %s CSI driver to attach volume %s", pv, driver, pv)
			var ev *v1.Event
			testsupport.Eventually(t, ctx, attachTimeout+time.Minute, "the attach timeout event", func(ctx context.Context) (bool, error) {
				sel := fields.Set{"involvedObject.name": "app", "reason": "FailedAttachVolume"}.String()
				evs, err := w.s.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
				if err != nil {
					return false, err
				}
				for i := range evs.Items {
					if strings.Contains(evs.Items[i].Message, "timed out waiting for external-attacher") {
						ev = &evs.Items[i]
						return true, nil
					}
				}
				return false, nil
			})
			if ev.Type != v1.EventTypeWarning || ev.Message != want {
				t.Errorf("event = %s %q, want Warning %q", ev.Type, ev.Message, want)
			}
			// kube-controller-manager waits csiTimeout from its attempt's
			// start, just before the create; the API server's times are in
			// whole seconds.
			at := ev.FirstTimestamp.Time
			if ev.EventTime.Time.After(at) {
				at = ev.EventTime.Time
			}
			if after := at.Sub(created); after < attachTimeout-time.Second || after > attachTimeout+20*time.Second {
				t.Errorf("event %v after the VolumeAttachment's creation, want %v", after, attachTimeout)
			}
			t.Logf("%s: event %v after the VolumeAttachment's creation", ad, at.Sub(created))
			mu.Lock()
			defer mu.Unlock()
			got[ad] = ev.Type + " " + ev.Reason + ": " + ev.Message
		})
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		// Each subtest fails on its own when its event is missing.
		if got[kcmAD] != "" && got[latchAD] != "" && got[kcmAD] != got[latchAD] {
			t.Errorf("kube-controller-manager recorded %q, latch %q", got[kcmAD], got[latchAD])
		}
	})
}
