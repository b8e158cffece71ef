package diagnose

import (
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// csi-attacher (as upstream's) writes detachError without errorCode: the
// gRPC code its message names still gives the code and the hint.
func TestExplainDetachErrorWithoutErrorCodeUsesTheCodeItsMessageNames(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	runScenarios(t, []scenario{{
		name:   "detachError naming code Unavailable, no errorCode",
		target: Target{Kind: TargetVA, Name: vaA},
		objs: edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) {
			va.DeletionTimestamp = agoPtr(time.Hour)
			va.Status.DetachError = &storagev1.VolumeError{Time: ago(time.Minute),
				Message: `ControllerUnpublishVolume volume "h" from node "n": rpc error: code = Unavailable desc = backend unreachable`}
		}),
		want: []expect{
			{"va.detachError", StatusProblem, []string{"(gRPC code 14)", "backend unreachable", "may still be in progress"}},
			{"va.recreate", StatusInfo, []string{"app/web"}},
		},
	}})
}
