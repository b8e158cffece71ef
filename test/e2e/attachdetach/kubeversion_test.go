package attachdetach_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// errorCodeMinor is the first minor whose API server keeps
// VolumeError.errorCode by default: the MutableCSINodeAllocatableCount
// gate guards the field, beta and off in 1.34, on from 1.35 (GA in 1.36).
// An API server with the gate off drops the field from every write.
const errorCodeMinor = 35

// What latch relies on, as the Kubernetes release under test serves it
// (make test-versions runs this on every minor; LATCH_TEST_KUBERNETES): the
// API server and the hollow kubelet are of that release, the kubelet
// registers a controller-managed Node, and a refused attach reaches the
// VolumeAttachment's status.attachError with the driver's code in its
// message on every minor, and in errorCode only where the API server
// keeps it (1.35 on). latchctl reads the code from the message when
// errorCode is missing (internal/diagnose), so its diagnosis is the same
// on every minor.
func TestKubernetesVersion_whatLatchReliesOn(t *testing.T) {
	r, selected, err := testsupport.SelectedKubernetes()
	if err != nil {
		t.Fatal(err)
	}
	if !selected {
		v, err := testsupport.InProcessKubernetes()
		if err != nil {
			t.Fatal(err)
		}
		r.Version, r.Minor = v, strings.Join(strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)[:2], ".")
	}
	minor, err := strconv.Atoi(strings.TrimPrefix(r.Minor, "1."))
	if err != nil {
		t.Fatalf("minor of %+v: %v", r, err)
	}
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})

	sv, err := e.client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if got := sv.Major + "." + strings.TrimSuffix(sv.Minor, "+"); got != r.Minor {
		t.Errorf("API server is Kubernetes %s (%s), want %s", got, sv.GitVersion, r.Minor)
	}
	if _, external, _ := testsupport.ExternalAPIServer(); external && sv.GitVersion != r.Version {
		t.Errorf("API server's gitVersion = %s, want %s", sv.GitVersion, r.Version)
	}
	t.Logf("API server %s (%s.%s)", sv.GitVersion, sv.Major, sv.Minor)

	node := e.addNode("n1")
	n := e.node(node)
	if selected && n.Status.NodeInfo.KubeletVersion != r.Version {
		t.Errorf("Node %s: kubeletVersion = %q, want %s", node, n.Status.NodeInfo.KubeletVersion, r.Version)
	}
	if n.Annotations[localcluster.ControllerManagedAnnotation] != "true" {
		t.Errorf("Node %s annotations = %v, want %s=true (attach/detach left to the controller)", node, n.Annotations, localcluster.ControllerManagedAnnotation)
	}
	t.Logf("kubelet %s", n.Status.NodeInfo.KubeletVersion)

	pv := e.volume("refused", rwo())
	driverMsg := "volume " + pv + " cannot be attached in this zone"
	fault, err := e.stack.Driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.InvalidArgument, Message: driverMsg})
	if err != nil {
		t.Fatal(err)
	}
	e.pod("app", node, pv)
	e.eventually("attachError on the VolumeAttachment", func() (bool, error) {
		va, ok := e.getVA(e.vaName(pv, node))
		return ok && va.Status.AttachError != nil, nil
	})
	va, _ := e.getVA(e.vaName(pv, node))
	attachErr := va.Status.AttachError
	if !strings.Contains(attachErr.Message, "code = "+codes.InvalidArgument.String()) || !strings.Contains(attachErr.Message, driverMsg) {
		t.Errorf("attachError.message = %q, want the driver's code and message", attachErr.Message)
	}
	switch {
	case minor < errorCodeMinor && attachErr.ErrorCode != nil:
		t.Errorf("Kubernetes %s kept attachError.errorCode = %d; its API server drops it (MutableCSINodeAllocatableCount off): the difference docs/upgrade.md describes is gone", r.Minor, *attachErr.ErrorCode)
	case minor >= errorCodeMinor && (attachErr.ErrorCode == nil || *attachErr.ErrorCode != int32(codes.InvalidArgument)):
		t.Errorf("Kubernetes %s: attachError.errorCode = %v, want %d (InvalidArgument)", r.Minor, attachErr.ErrorCode, codes.InvalidArgument)
	}
	t.Logf("attachError: errorCode %s, message %q", fmtCode(attachErr.ErrorCode), attachErr.Message)
	// kube-controller-manager's text, the same on every minor.
	want := fmt.Sprintf("AttachVolume.Attach failed for volume %q : ", pv)
	e.eventually("FailedAttachVolume on the Pod with the attachError", func() (bool, error) {
		for _, ev := range e.events("app", "FailedAttachVolume") {
			if strings.HasPrefix(ev.Message, want) && strings.Contains(ev.Message, driverMsg) {
				return true, nil
			}
		}
		return false, nil
	})

	if !e.stack.Driver.RemoveFault(fault) {
		t.Fatal("fault rule not found")
	}
	e.waitAttachedVA(pv, node)
	e.waitNodeAttached(node, e.unique(pv))
	e.waitPodRunning("app")
	e.deletePod("app")
	e.waitPodGone("app")
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)
}

func fmtCode(c *int32) string {
	if c == nil {
		return "absent"
	}
	return strconv.Itoa(int(*c))
}
