package diagnose

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A VolumeAttachment create the API server refuses leaves no
// VolumeAttachment and only the Pod's FailedAttachVolume event (the text
// kube-controller-manager's and latch's attach/detach controllers record).
// latchctl says what refused it and where to change that, instead of
// "no VolumeAttachment yet".
func TestExplainCreateRefused(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	// refused is the world in which the Pod web waits for a VolumeAttachment
	// whose creates failed with answer (events on Pod web, for pv).
	refused := func(pv, answer string) []runtime.Object {
		objs := drop[*storagev1.VolumeAttachment](healthy(), "")
		objs = edit(objs, nodeA, func(n *v1.Node) { n.Status.VolumesAttached, n.Status.VolumesInUse = nil, nil })
		return append(objs, newEvent("Pod", ns, "web", "FailedAttachVolume",
			`AttachVolume.Attach failed for volume "`+pv+`" : kubernetes.io/csi: attacher.Attach failed: `+answer))
	}
	denied := `volumeattachments.storage.k8s.io "` + vaA + `" is forbidden: `
	runScenarios(t, []scenario{
		{
			name: "an admission policy denies the create → problem naming the policy, its binding and its message",
			objs: refused(pvName, denied+"ValidatingAdmissionPolicy 'freeze-data' with binding 'freeze-data-binding' denied request: volume pv-data is frozen"),
			want: []expect{{"va.createRefused", StatusProblem, []string{"VolumeAttachment " + vaA, "refused", "node-a", "3 times", "Pod app/web",
				"volume pv-data is frozen", "ValidatingAdmissionPolicy freeze-data", "binding freeze-data-binding",
				"kubectl get validatingadmissionpolicy freeze-data -o yaml", "retries with backoff"}}},
			absent: []string{"va.exists"},
		},
		{
			name: "a webhook denies the create → problem naming the webhook",
			objs: refused(pvName, `admission webhook "va-guard.example.com" denied the request: no attaches on Fridays`),
			want: []expect{{"va.createRefused", StatusProblem, []string{"no attaches on Fridays", "admission webhook va-guard.example.com",
				"validatingwebhookconfigurations"}}},
			absent: []string{"va.exists"},
		},
		{
			name: "RBAC refuses the create → problem with the exact rule",
			objs: refused(pvName, `volumeattachments.storage.k8s.io is forbidden: User "system:serviceaccount:kube-system:attachdetach-controller" cannot create resource "volumeattachments" in API group "storage.k8s.io" at the cluster scope`),
			want: []expect{{"va.createRefused", StatusProblem, []string{"cannot create resource", "{apiGroups: [storage.k8s.io], resources: [volumeattachments], verbs: [create]}"}}},
		},
		{
			name:    "the last create timed out → waiting, retried",
			objs:    refused(pvName, "the server was unable to return a response in the time allotted, but may still be processing the request (post volumeattachments.storage.k8s.io)"),
			want:    []expect{{"va.createFailed", StatusWaiting, []string{"last create", "unable to return a response", "retries the create with backoff"}}},
			absent:  []string{"va.createRefused", "va.exists"},
			healthy: true,
		},
		{
			name:    "the refusal is about another PV → not this volume's: no VolumeAttachment yet",
			objs:    refused("pv-other", denied+"ValidatingAdmissionPolicy 'freeze-other' with binding 'b' denied request: frozen"),
			want:    []expect{{"va.exists", StatusWaiting, []string{"no VolumeAttachment"}}},
			absent:  []string{"va.createRefused"},
			healthy: true,
		},
	})
}
