package attacher_test

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube"
)

// An upper-case driver name is valid (Kubernetes checks driver names
// ignoring case) but upper case is not valid in an object name: upstream's
// Lease "external-attacher-leader-Example-CSI-Driver" is refused by the API
// server and leader election never acquires. latch lower-cases the Lease
// name; the finalizer keeps the driver's case, as upstream's does.
func TestLeaderElectionWithUpperCaseDriverNameAcquiresLeaseAndAttaches(t *testing.T) {
	e := newEnv(t, envOptions{leader: true, driverName: "Example.CSI.Driver"})
	const leaseName = "external-attacher-leader-example-csi-driver"
	if got := kube.LeaseName(e.name); got != leaseName {
		t.Fatalf("LeaseName(%q) = %q, want %q", e.name, got, leaseName)
	}
	e.eventually(30*time.Second, "Lease "+leaseName+" held", func() (bool, error) {
		l, err := e.client.CoordinationV1().Leases("default").Get(e.ctx, leaseName, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	})

	pv, vaName, va := e.attachOne(30 * time.Second)
	if want := "external-attacher/Example-CSI-Driver"; !slices.Contains(va.Finalizers, want) {
		t.Errorf("VolumeAttachment finalizers = %v, want %s", va.Finalizers, want)
	}
	if got := e.driver.PublishCount(pv, e.nodeID); got != 1 {
		t.Errorf("ControllerPublish count = %d, want 1", got)
	}
	e.deleteVA(vaName)
	e.waitGone(vaName)
	if slices.Contains(e.driver.Published(pv), e.nodeID) {
		t.Errorf("volume still published on %s after the VolumeAttachment is gone", e.nodeID)
	}
}
