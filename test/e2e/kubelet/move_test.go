package kubelet_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestKubeletRWOVolumeMovesBetweenNodes: three hollow nodes, one RWO
// volume moved A → B → C by deleting its Pod and creating one on the next
// node. While the old Pod runs, the new Pod waits (Multi-Attach warning,
// no VolumeAttachment, no ControllerPublish to the new node); once the
// old Pod is deleted, the old node unmounts and the volume is detached
// from it (checkDetach's order), and only then is it attached to and
// mounted on the new node (its VolumeAttachment created after the old
// one was removed, ControllerPublish after ControllerUnpublish ended).
func TestKubeletRWOVolumeMovesBetweenNodes(t *testing.T) {
	r := newRig(t, 6*time.Minute, rigOptions{Mock: slowPublishAndUnstage})
	nodes := []*node{r.addNode("a", 0), r.addNode("b", 0), r.addNode("c", 0)}
	vol := r.volume("vol")
	r.pod("app-0", nodes[0], vol)
	r.waitPodRunning("app-0", 90*time.Second)
	r.checkAttach(vol, nodes[0], "app-0")

	for i := 1; i < len(nodes); i++ {
		from, to := nodes[i-1], nodes[i]
		old, pod := "app-"+strconv.Itoa(i-1), "app-"+strconv.Itoa(i)
		r.pod(pod, to, vol)
		testsupport.Eventually(t, r.ctx, 30*time.Second, "a Multi-Attach warning on Pod "+pod, func(ctx context.Context) (bool, error) {
			return r.hasEvent(ctx, pod, "FailedAttachVolume", "Multi-Attach error")
		}, r.dumpCalls)
		r.consistently("Pod "+pod+" waits while "+old+" runs on "+from.Name, 3*time.Second, func(ctx context.Context) (string, error) {
			p, _, err := r.getPod(ctx, pod)
			if err != nil {
				return "", err
			}
			_, vaExists, err := r.getVA(ctx, vol, to)
			_, published := findNodeCall(r.s.Driver.Calls(), "ControllerPublishVolume", vol, to.id, codes.OK)
			switch {
			case p.Status.Phase == v1.PodRunning:
				return "Pod " + pod + " Running", err
			case vaExists:
				return "VolumeAttachment to " + to.Name + " created", err
			case published:
				return "ControllerPublish to " + to.id, err
			}
			return "", err
		})

		r.deletePod(old)
		r.waitPodRunning(pod, 2*time.Minute)
		r.waitPodGone(old, time.Minute)
		d := r.checkDetach(vol, from)
		a := r.checkAttach(vol, to, pod)
		created := r.hist.mustFirst(t, "VolumeAttachment "+r.vaName(vol, to)+" created", func(c change) bool {
			return c.Type == watch.Added && vaNamed(r.vaName(vol, to), func(*storagev1.VolumeAttachment) bool { return true })(c)
		})
		if created.RV < d.gone.RV {
			t.Errorf("VolumeAttachment to %s created (%s) before the one to %s was removed (%s)", to.Name, created, from.Name, d.gone)
		}
		if !d.ctrlUnpublish.End.Before(a.publish.Start) {
			t.Errorf("ControllerPublish to %s (%s) before ControllerUnpublish from %s ended (%s)", to.id, stamp(a.publish.Start), from.id, stamp(d.ctrlUnpublish.End))
		}
		t.Logf("move %s → %s: NodeUnstage on %s ended %s, VA removed RV %d, ControllerUnpublish %s–%s; VA to %s created RV %d, ControllerPublish %s, NodeStage %s, Pod Running RV %d",
			from.Name, to.Name, from.Name, stamp(d.unstage.End), d.gone.RV, stamp(d.ctrlUnpublish.Start), stamp(d.ctrlUnpublish.End),
			to.Name, created.RV, stamp(a.publish.Start), stamp(a.stage.Start), a.running.RV)
	}
	last := nodes[len(nodes)-1]
	r.deletePod("app-" + strconv.Itoa(len(nodes)-1))
	r.waitDetached(vol, last, 2*time.Minute)
	r.checkDetach(vol, last)
	if got := r.s.Driver.Published(vol); len(got) != 0 {
		t.Errorf("volume %s still published to %v", vol, got)
	}
}

// hasEvent: Pod pod has an event of reason whose message contains msg.
func (r *rig) hasEvent(ctx context.Context, pod, reason, msg string) (bool, error) {
	e, err := r.podEvent(ctx, pod, reason, msg, "")
	return e != nil, err
}
