package stack

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) { RunTestMain(m, &cluster) }

// Each attacher mode brings a Pod's volume to the node through both
// controllers: the VolumeAttachment is attached, the driver published
// the volume once (none is called in trivial mode) and the Pod runs.
func TestStackAttachesAPodsVolumeInEveryAttacherMode(t *testing.T) {
	for i, tc := range []struct {
		name     string
		mode     AttacherMode
		replicas int
	}{
		{"in-process", AttacherInProcess, 1},
		{"two in-process replicas", AttacherInProcess, 2},
		{"binary", AttacherBinary, 1},
		{"trivial", AttacherTrivial, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			prefix := fmt.Sprintf("stack%d", i)
			driver := prefix + ".csi.latch.test"
			node := prefix + "-node"
			s := startStack(t, ctx, Options{
				Cluster: cluster, Driver: driver, Attacher: tc.mode, Replicas: tc.replicas,
				Nodes: []localcluster.NodeConfig{{Name: node}},
			})
			if got := len(s.Attachers); got != tc.replicas {
				t.Fatalf("%d attachers running, want %d", got, tc.replicas)
			}
			ns := prefix + "-ns"
			if err := localcluster.CreateNamespace(ctx, s.Client, ns); err != nil {
				t.Fatal(err)
			}
			if _, _, err := localcluster.CreateBoundVolume(ctx, s.Client, localcluster.VolumeSpec{Namespace: ns, Name: prefix + "-vol", Driver: driver}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, "app", node, prefix+"-vol"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			testsupport.Eventually(t, ctx, time.Minute, "the Pod running with its volume attached", func(ctx context.Context) (bool, error) {
				p, err := s.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				return p.Status.Phase == v1.PodRunning, nil
			})
			vas, err := s.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			attached := 0
			for _, va := range vas.Items {
				if va.Spec.Attacher == driver && va.Spec.NodeName == node && va.Status.Attached {
					attached++
				}
			}
			if attached != 1 {
				t.Errorf("%d attached VolumeAttachments of %s on %s, want 1", attached, driver, node)
			}
			if tc.mode == AttacherTrivial {
				if s.Driver != nil {
					t.Error("trivial mode started a mock driver")
				}
			} else if n := s.Driver.PublishCount(prefix+"-vol", NodeID(node)); n != 1 {
				t.Errorf("ControllerPublish of %s to %s: %d calls, want 1", prefix+"-vol", NodeID(node), n)
			}
			// Leave nothing for the next mode's controller to act on.
			if err := s.Client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
			waitNoVolumeAttachments(t, ctx, s, driver)
		})
	}
}

// waitNoVolumeAttachments waits until no VolumeAttachment of driver is
// left.
func waitNoVolumeAttachments(t *testing.T, ctx context.Context, s *Stack, driver string) {
	t.Helper()
	testsupport.Eventually(t, ctx, time.Minute, "no VolumeAttachment of "+driver+" left", func(ctx context.Context) (bool, error) {
		return noVolumeAttachmentOf(ctx, s, driver)
	})
}

// noVolumeAttachmentOf says whether the API server lists no
// VolumeAttachment of driver.
func noVolumeAttachmentOf(ctx context.Context, s *Stack, driver string) (bool, error) {
	vas, err := s.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, va := range vas.Items {
		if va.Spec.Attacher == driver {
			return false, nil
		}
	}
	return true, nil
}

// startStack is Start that fails the test; the stack stops when the test
// ends.
func startStack(t *testing.T, ctx context.Context, o Options) *Stack {
	t.Helper()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
}
