package diagnose

import (
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// newAttacherPod is a running Pod of namespace/name with a csi-attacher
// container of image and args, beside a driver container.
func newAttacherPod(namespace, name, image string, args ...string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1.PodSpec{Containers: []v1.Container{
			{Name: "driver", Image: "example.com/csi-driver:v1"},
			{Name: "csi-attacher", Image: image, Args: args},
		}},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
}

const upstreamAttacherImage = "registry.k8s.io/sig-storage/csi-attacher:v4.13.0"

// Issue 24: latchctl's findings say which object is wrong and the next
// command to run, without noise.
func TestExplainOperatorFindings(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	// pendingNoLease: the attach waits for csi-attacher and no Lease exists.
	pendingNoLease := func(extra ...runtime.Object) []runtime.Object {
		objs := drop[*coordLease](edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) { va.Status.Attached = false }), "")
		return append(objs, extra...)
	}
	secretRef := func(objs []runtime.Object) []runtime.Object {
		return edit(objs, pvName, func(p *v1.PersistentVolume) {
			p.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "creds-ns", Name: "publish-creds"}
		})
	}
	attachError := func(msg string) func(*storagev1.VolumeAttachment) {
		return func(va *storagev1.VolumeAttachment) {
			va.Status.Attached = false
			va.Status.AttachError = &storagev1.VolumeError{Time: ago(time.Minute), Message: msg}
		}
	}
	runScenarios(t, []scenario{
		{
			name: "no Lease, an attacher Pod runs without --leader-election → leader election off (info), next: its logs, not a grep",
			objs: pendingNoLease(newAttacherPod("storage", "ctrl-0", upstreamAttacherImage, "--csi-address=/csi/csi.sock", "--v=2")),
			want: []expect{{"attacher.lease", StatusInfo, []string{"leader election is off", "Pod storage/ctrl-0", "container csi-attacher",
				"kubectl -n storage logs ctrl-0 -c csi-attacher"}}},
			absent: []string{}, healthy: true,
		},
		{
			name: "no Lease, the only attacher Pods run with --leader-election → none serves this driver: problem naming the driver",
			objs: pendingNoLease(newAttacherPod("storage", "other-0", upstreamAttacherImage, "--csi-address=/csi/csi.sock", "--leader-election")),
			want: []expect{{"attacher.lease", StatusProblem, []string{"no csi-attacher of driver " + drv, "storage/other-0", "--leader-election",
				"kubectl get csidriver " + drv}}},
		},
		{
			name: "no Lease, no attacher Pod anywhere → problem: no csi-attacher runs",
			objs: pendingNoLease(),
			want: []expect{{"attacher.lease", StatusProblem, []string{"no Pod runs a csi-attacher container", "kubectl get csidriver " + drv}}},
		},
		{
			name: "no Lease, attacher Pod not running → counted as not running",
			objs: pendingNoLease(func() *v1.Pod {
				p := newAttacherPod("storage", "ctrl-0", upstreamAttacherImage)
				p.Status.Phase = v1.PodPending
				return p
			}()),
			want: []expect{{"attacher.lease", StatusProblem, []string{"storage/ctrl-0 (Pending)"}}},
		},
		{
			name:    "no Lease, no attacher Pod, but the detach still waits for the kubelet's unmount → waiting, not yet a problem",
			target:  Target{Kind: TargetVA, Name: vaA},
			objs:    drop[*coordLease](edit(drop[*v1.Pod](healthy(), ""), vaA, func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = agoPtr(time.Minute) }), ""),
			want:    []expect{{"attacher.lease", StatusWaiting, []string{"no Pod runs a csi-attacher container"}}},
			healthy: true,
		},
		{
			name:   "Pod on a node that does not exist → only the missing node, no second CSINode problem",
			objs:   drop[*storagev1.CSINode](drop[*v1.Node](healthy(), ""), ""),
			want:   []expect{{"node.exists", StatusProblem, []string{"Node node-a not found", "kubectl delete pod -n app web"}}},
			absent: []string{"csinode.driver"},
		},
		{
			name: "missing controller-publish secret → names the Secret (from the PV) and the command to check it",
			objs: secretRef(edit(healthy(), vaA, attachError("controller publish secret creds-ns/publish-creds not found"))),
			want: []expect{{"va.attachError", StatusProblem, []string{"Secret creds-ns/publish-creds", "kubectl -n creds-ns get secret publish-creds",
				"spec.csi.controllerPublishSecretRef of PersistentVolume " + pvName}}},
		},
		{
			name: "forbidden controller-publish secret → names the Secret and the RBAC check with the attacher's ServiceAccount",
			objs: secretRef(edit(healthy(), vaA, attachError(`controller publish secret creds-ns/publish-creds: csi-attacher is not allowed to read it (secrets "publish-creds" is forbidden: User "system:serviceaccount:storage:csi-attacher-sa" cannot get resource "secrets" in API group "" in the namespace "creds-ns"); grant its ServiceAccount a Role with verbs [get] on resource secrets in namespace "creds-ns"`))),
			want: []expect{{"va.attachError", StatusProblem, []string{"Secret creds-ns/publish-creds",
				"kubectl auth can-i get secret/publish-creds -n creds-ns --as=system:serviceaccount:storage:csi-attacher-sa"}}},
		},
		{
			name: "forbidden secret without the user in the message → the RBAC check with a placeholder ServiceAccount",
			objs: secretRef(edit(healthy(), vaA, attachError("controller publish secret creds-ns/publish-creds: csi-attacher is not allowed to read it (forbidden)"))),
			want: []expect{{"va.attachError", StatusProblem, []string{
				"kubectl auth can-i get secret/publish-creds -n creds-ns --as=system:serviceaccount:<attacher-namespace>:<attacher-serviceaccount>"}}},
		},
		{
			name: "secret error in another wording → the Secret from the PV's reference",
			objs: secretRef(edit(healthy(), vaA, attachError("cannot read the controller-publish Secret: forbidden"))),
			want: []expect{{"va.attachError", StatusProblem, []string{"Secret creds-ns/publish-creds", "kubectl auth can-i get secret/publish-creds -n creds-ns"}}},
		},
		{
			name: "driver refuses the credentials (PermissionDenied) → names the PV's Secret",
			objs: secretRef(edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) {
				attachError("rpc error: code = PermissionDenied desc = bad credentials")(va)
				c := int32(7)
				va.Status.AttachError.ErrorCode = &c
			})),
			want: []expect{{"va.attachError", StatusProblem, []string{"Secret creds-ns/publish-creds", "kubectl -n creds-ns get secret publish-creds"}}},
		},
	})
}

// Pods cannot be listed: the missing Lease stays a waiting finding that
// gives the command telling the two causes apart.
func TestExplainNoLeasePodsUnreadable(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	s := NewSnapshot(now, drop[*coordLease](edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) { va.Status.Attached = false }), "")...)
	s.Unreadable[Ref{Kind: RefAttacherPodList}] = "forbidden"
	r := Explain(podWeb, s)
	checkExpect(t, r, expect{"attacher.lease", StatusWaiting, []string{"leader election is off", "or no csi-attacher of driver " + drv + " runs", "forbidden", "kubectl get pods -A -o jsonpath="}})
}

// Every problem and waiting finding names its object; the ones above also
// name the next command (checked by their Says).
func TestExplainFindingsNameTheirObject(t *testing.T) {
	for _, objs := range [][]runtime.Object{
		drop[*v1.Node](healthy(), ""),
		drop[*coordLease](edit(healthy(), "", func(va *storagev1.VolumeAttachment) { va.Status.Attached = false }), ""),
	} {
		r := Explain(podWeb, NewSnapshot(now, objs...))
		for _, f := range r.Findings {
			if (f.Status == StatusProblem || f.Status == StatusWaiting) && f.Object == "" {
				t.Errorf("%s finding %s names no object: %s", f.Status, f.Check, f.Message)
			}
		}
	}
}
