package stack

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// A killed component's end is not a failure: Stop and Err stay quiet.
func TestKilledComponentIsNotReported(t *testing.T) {
	s := &Stack{errs: make(chan error, 1)}
	c := Go(context.Background(), "killed", func(ctx context.Context) error { <-ctx.Done(); return errors.New("connection cut") })
	s.watch(c)
	c.Kill()
	<-c.Exited()
	if err := c.Stop(); err != nil {
		t.Errorf("Stop of a killed component = %v, want nil", err)
	}
	select {
	case err := <-s.Err():
		t.Errorf("Err reported a killed component: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}

// A supervised attacher whose RunSidecar returns (no driver to connect
// to) is restarted and counted, and stops cleanly.
func TestRestartingAttacherRestartsRunSidecar(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := AttacherConfig(cluster.RESTConfig(), filepath.Join(t.TempDir(), "nothing.sock"))
	cfg.ConnectTimeout = 50 * time.Millisecond
	a := RestartingAttacher(ctx, "csi-attacher", cfg)
	testsupport.Eventually(t, ctx, 30*time.Second, "two restarts", func(context.Context) (bool, error) { return a.Restarts() >= 2, nil })
	if err := a.Stop(); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	if n := Go(ctx, "plain", func(ctx context.Context) error { <-ctx.Done(); return nil }); n.Restarts() != 0 {
		t.Errorf("an unsupervised component reports %d restarts", n.Restarts())
	}
}

// AttacherOnDemand starts the mock driver and no attacher; RunAttacher
// and StartController bring the rest when the caller wants, and a second
// controller after a killed one takes over (each start gets the adjusted
// configuration).
func TestOnDemandAttacherAndRestartedController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const driver, node, ns = "ondemand.csi.latch.test", "ondemand-node", "ondemand-ns"
	starts := 0
	s := startStack(t, ctx, Options{
		Cluster: cluster, Driver: driver, Attacher: AttacherOnDemand, NoController: true,
		Nodes:            []localcluster.NodeConfig{{Name: node}},
		ControllerConfig: func(c *controller.ServeConfig) { starts++ },
	})
	if s.Driver == nil || s.Socket == "" || len(s.Attachers) != 0 || s.Controller != nil {
		t.Fatalf("on demand: driver %v socket %q, %d attachers, controller %v; want a driver and nothing else", s.Driver, s.Socket, len(s.Attachers), s.Controller)
	}
	s.RunAttacher(ctx, "csi-attacher", AttacherConfig(s.Cluster.RESTConfig(), s.Socket))
	first := s.StartController(ctx)
	if err := localcluster.CreateNamespace(ctx, s.Client, ns); err != nil {
		t.Fatal(err)
	}
	running := func(pod, vol string) {
		t.Helper()
		if _, _, err := localcluster.CreateBoundVolume(ctx, s.Client, localcluster.VolumeSpec{Namespace: ns, Name: vol, Driver: driver}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, pod, node, vol), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, ctx, time.Minute, pod+" running", func(ctx context.Context) (bool, error) {
			p, err := s.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
			return err == nil && p.Status.Phase == v1.PodRunning, nil
		})
		if n := s.Driver.PublishCount(vol, NodeID(node)); n != 1 {
			t.Errorf("ControllerPublish of %s: %d calls, want 1", vol, n)
		}
	}
	running("one", "ondemand-vol1")
	first.Kill()
	<-first.Exited()
	if second := s.StartController(ctx); s.Controller != second || second == first {
		t.Fatal("StartController did not make the new controller s.Controller")
	}
	running("two", "ondemand-vol2")
	if starts != 2 {
		t.Errorf("ControllerConfig called %d times, want 2 (once per start)", starts)
	}
	for _, p := range []string{"one", "two"} {
		if err := s.Client.CoreV1().Pods(ns).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	waitNoVolumeAttachments(t, ctx, s, driver)
}
