package attachdetach_test

import (
	"net/http"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
)

// newRecordingEnv is newEnv with the real csi-attacher against a mock
// driver (envOptions.mockDriver) that lets a single-node volume onto a second
// node and records it (SkipSingleNodeCheck), so a test sees what the
// controllers asked for rather than what the driver refused, and with
// wrap (when not nil) around the controller's API transport.
func newRecordingEnv(t *testing.T, cfg controller.Config, wrap func(http.RoundTripper) http.RoundTripper) (*env, *csimock.Driver) {
	t.Helper()
	e := newEnvWith(t, envOptions{cfg: cfg, mockDriver: true, driverConfig: func(c *csimock.Config) { c.SkipSingleNodeCheck = true }, ctrlWrap: wrap})
	return e, e.stack.Driver
}

// aliasVolume creates a bound PV+PVC named name with the given access
// modes whose CSI volume handle is handle: several PVs can name one
// unique volume.
func (e *env) aliasVolume(name, handle string, modes ...v1.PersistentVolumeAccessMode) string {
	e.t.Helper()
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, localcluster.VolumeSpec{
		Namespace: e.ns, Name: name, Driver: e.driver, Handle: handle, AccessModes: modes,
	}); err != nil {
		e.t.Fatal(err)
	}
	return name
}

// publishes returns the driver's finished ControllerPublishVolume and
// ControllerUnpublishVolume calls for handle, in the order they ended.
func publishes(drv *csimock.Driver, handle string) []csimock.Call {
	var out []csimock.Call
	for _, c := range drv.Calls() {
		if c.VolumeID == handle && c.Done() && (c.Method == "ControllerPublishVolume" || c.Method == "ControllerUnpublishVolume") {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b csimock.Call) int { return a.End.Compare(b.End) })
	return out
}

// publishedTo reports whether the driver got a ControllerPublishVolume of
// handle for nodeID (whatever its outcome).
func publishedTo(drv *csimock.Driver, handle, nodeID string) bool {
	return slices.ContainsFunc(drv.CallsTo("ControllerPublishVolume"), func(c csimock.Call) bool {
		return c.VolumeID == handle && c.NodeID == nodeID
	})
}

// checkHandedOver fails unless the driver saw, for handle, exactly: a
// successful publish to from, its successful unpublish, then a successful
// publish to to; and never had the volume on two nodes at once.
func checkHandedOver(t *testing.T, drv *csimock.Driver, handle, from, to string) {
	t.Helper()
	type step struct{ method, node string }
	var got []step
	for _, c := range publishes(drv, handle) {
		if c.Code != codes.OK {
			t.Errorf("%s of %s to %s failed: %s %s", c.Method, handle, c.NodeID, c.CodeName, c.Message)
			continue
		}
		got = append(got, step{c.Method, c.NodeID})
	}
	want := []step{{"ControllerPublishVolume", from}, {"ControllerUnpublishVolume", from}, {"ControllerPublishVolume", to}}
	if !slices.Equal(got, want) {
		t.Errorf("driver calls for %s = %v, want %v", handle, got, want)
	}
	for _, v := range drv.Stats().Publish.SingleNodeViolations {
		if v.VolumeID == handle {
			t.Errorf("single-node volume %s was published to %s while on %v", handle, v.NodeID, v.OtherNodes)
		}
	}
}

// Two PVs with one volume handle are one unique volume. Whichever PV
// names it exclusively makes it exclusive: a ReadWriteMany alias must not
// attach it to a second node while a ReadWriteOnce PV has it on the first
// (nor the other way round). kube-controller-manager checks only the PV
// being attached and lets the RWX alias through.
func TestMultiAttach_aliasPVsOfOneHandle_exclusiveIfAnySpecIs(t *testing.T) {
	e, drv := newRecordingEnv(t, controller.Config{}, nil)
	n1, n2 := e.addNode("n1"), e.addNode("n2")

	for _, tc := range []struct {
		name, handle string
		first, later []v1.PersistentVolumeAccessMode
	}{
		{"RWO attached on node 1, RWX alias on node 2", "rwo-first", []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}},
		{"RWX attached on node 1, RWO alias on node 2", "rwx-first", []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}, []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			handle := e.prefix + "-" + tc.handle
			pv1 := e.aliasVolume(handle+"-a", handle, tc.first...)
			pv2 := e.aliasVolume(handle+"-b", handle, tc.later...)
			p1, p2 := handle+"-p1", handle+"-p2"

			e.pod(p1, n1, pv1)
			e.waitAttachedVA(handle, n1)
			e.waitPodRunning(p1)

			e.pod(p2, n2, pv2)
			// The Pod is told why, once, with the upstream text.
			e.waitsThenTakesOver(drv, handle, p2, n2, pv2, p1, n1)
		})
	}
	e.t = t
}
