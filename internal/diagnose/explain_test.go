package diagnose

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// expect says that a finding with Check and Status exists whose message and
// hint contain every string of Says.
type expect struct {
	Check  string
	Status Status
	Says   []string
}

type scenario struct {
	name    string
	target  Target
	objs    []runtime.Object
	want    []expect
	absent  []string // checks that must not appear
	healthy bool
}

var podWeb = Target{Kind: TargetPod, Namespace: ns, Name: "web"}

func TestExplainPodVolumeChain(t *testing.T) {
	runScenarios(t, []scenario{
		{
			name: "healthy pod: every step ok → healthy, nothing waiting",
			objs: healthy(), healthy: true,
			want: []expect{
				{"pod.scheduled", StatusOK, []string{nodeA}},
				{"pvc.bound", StatusOK, []string{pvName}},
				{"pv.csi", StatusOK, []string{drv, handle}},
				{"csidriver", StatusOK, nil},
				{"node", StatusOK, nil},
				{"csinode.driver", StatusOK, []string{drv + "/" + nodeA}},
				{"va.attached", StatusOK, nil},
				{"attacher.lease", StatusOK, []string{"attacher-0", "kube-system"}},
				{"node.volumesAttached", StatusOK, nil},
				{"node.volumesInUse", StatusOK, nil},
			},
			absent: []string{"multiattach", "va.exists"},
		},
		{
			name: "pod not found → problem naming it",
			objs: drop[*v1.Pod](healthy(), "web"),
			want: []expect{{"pod.exists", StatusProblem, []string{"app/web"}}},
		},
		{
			name: "pod not scheduled → waiting, its PVC is still checked",
			objs: edit(healthy(), "web", func(p *v1.Pod) { p.Spec.NodeName = "" }),
			want: []expect{
				{"pod.scheduled", StatusWaiting, []string{"FailedScheduling"}},
				{"pvc.bound", StatusOK, nil},
			},
			absent: []string{"va.attached", "node"}, healthy: true,
		},
		{
			name: "pvc missing → problem, hint names the PVC",
			objs: drop[*v1.PersistentVolumeClaim](healthy(), "data"),
			want: []expect{{"pvc.exists", StatusProblem, []string{"app/data"}}},
		},
		{
			name: "pvc unbound → waiting, hint names the PVC",
			objs: edit(healthy(), "data", func(c *v1.PersistentVolumeClaim) {
				c.Spec.VolumeName, c.Status.Phase = "", v1.ClaimPending
				sc := "fast"
				c.Spec.StorageClassName = &sc
			}),
			want:   []expect{{"pvc.bound", StatusWaiting, []string{"Pending", "describe pvc -n app data", `"fast"`}}},
			absent: []string{"pv.csi", "va.attached"}, healthy: true,
		},
		{
			name: "pvc Lost → problem",
			objs: edit(healthy(), "data", func(c *v1.PersistentVolumeClaim) { c.Status.Phase = v1.ClaimLost }),
			want: []expect{{"pvc.bound", StatusProblem, []string{"Lost", pvName}}},
		},
		{
			name: "pv missing although the pvc is bound → problem",
			objs: drop[*v1.PersistentVolume](healthy(), pvName),
			want: []expect{{"pv.exists", StatusProblem, []string{pvName, "app/data"}}},
		},
		{
			name: "pv claimRef uid differs from the pvc → problem, binding inconsistent",
			objs: edit(healthy(), pvName, func(p *v1.PersistentVolume) { p.Spec.ClaimRef.UID = "old-uid" }),
			want: []expect{{"pv.claimRef", StatusProblem, []string{"old-uid", "uid-pvc-data"}}},
		},
		{
			name: "generic ephemeral volume without its PVC → hint names the ephemeral volume controller",
			objs: edit(drop[*v1.PersistentVolumeClaim](healthy(), ""), "web", func(p *v1.Pod) {
				p.Spec.Volumes = []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}}
			}),
			want: []expect{{"pvc.exists", StatusProblem, []string{"app/web-scratch", "ephemeral-volume controller"}}},
		},
		{
			name: "pod without persistent volumes → nothing to attach",
			objs: edit(healthy(), "web", func(p *v1.Pod) { p.Spec.Volumes = nil }),
			want: []expect{{"pod.volumes", StatusOK, []string{"nothing to attach"}}}, healthy: true,
		},
		{
			name: "CSI ephemeral inline volume → never attached",
			objs: edit(healthy(), "web", func(p *v1.Pod) {
				p.Spec.Volumes = []v1.Volume{{Name: "secrets", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "secrets.example.com"}}}}
			}),
			want: []expect{{"volume.inline", StatusOK, []string{"never attached", "secrets.example.com"}}}, healthy: true,
		},
	})
}

func TestExplainDriverAndMigration(t *testing.T) {
	ebsHandle := "vol-0123456789abcdef0"
	ebs := func(objs []runtime.Object) []runtime.Object {
		objs = edit(objs, pvName, func(p *v1.PersistentVolume) {
			p.Spec.CSI = nil
			p.Spec.AWSElasticBlockStore = &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/" + ebsHandle}
		})
		return drop[*storagev1.VolumeAttachment](objs, "")
	}
	runScenarios(t, []scenario{
		{
			name: "CSIDriver attachRequired=false → no attach needed, no VolumeAttachment checks",
			objs: drop[*storagev1.VolumeAttachment](edit(healthy(), drv, func(d *storagev1.CSIDriver) { f := false; d.Spec.AttachRequired = &f }), ""),
			want: []expect{{"csidriver", StatusOK, []string{"no attach needed"}}}, healthy: true,
			absent: []string{"va.exists", "va.attached", "csinode.driver"},
		},
		{
			name: "no CSIDriver object → attach required, note to check the driver is installed",
			objs: drop[*storagev1.CSIDriver](healthy(), ""),
			want: []expect{{"csidriver", StatusInfo, []string{"attach is required", "installed"}}, {"va.attached", StatusOK, nil}}, healthy: true,
		},
		{
			name: "in-tree EBS PV → translated through CSI migration, VolumeAttachment looked up under the translated handle",
			objs: ebs(healthy()),
			want: []expect{
				{"pv.csi", StatusOK, []string{"migration", "ebs.csi.aws.com", ebsHandle}},
				{"va.exists", StatusWaiting, []string{kubenames.VolumeAttachmentName(ebsHandle, "ebs.csi.aws.com", nodeA)}},
			},
		},
		{
			name: "in-tree PV no driver migrates → info, latch does not attach it",
			objs: edit(healthy(), pvName, func(p *v1.PersistentVolume) {
				p.Spec.CSI = nil
				p.Spec.NFS = &v1.NFSVolumeSource{Server: "nfs", Path: "/x"}
			}),
			want: []expect{{"pv.csi", StatusInfo, []string{"not a CSI volume"}}}, healthy: true,
			absent: []string{"va.attached"},
		},
		{
			name: "PV with empty volume handle → problem",
			objs: edit(healthy(), pvName, func(p *v1.PersistentVolume) { p.Spec.CSI.VolumeHandle = "" }),
			want: []expect{{"pv.csi", StatusProblem, []string{"volumeHandle is empty"}}},
		},
	})
}

func TestExplainVolumeAttachment(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	code := func(c int32) *int32 { return &c }
	runScenarios(t, []scenario{
		{
			name: "no VolumeAttachment for a scheduled pod → waiting, hint names the attach/detach controller and the expected name",
			objs: edit(drop[*storagev1.VolumeAttachment](healthy(), ""), nodeA, func(n *v1.Node) { n.Status.VolumesAttached, n.Status.VolumesInUse = nil, nil }),
			want: []expect{{"va.exists", StatusWaiting, []string{vaA, "attach/detach controller"}}}, healthy: true,
		},
		{
			name: "VolumeAttachment pending without error → waiting on csi-attacher",
			objs: edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) { va.Status.Attached = false }),
			want: []expect{{"va.attached", StatusWaiting, []string{"not attached yet", "10m"}}}, healthy: true,
		},
		{
			name: "attachError from the driver (FailedPrecondition) → problem with message, age and a backend hint",
			objs: edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) {
				va.Status.Attached = false
				va.Status.AttachError = &storagev1.VolumeError{Time: ago(90 * time.Second), Message: "rpc error: code = FailedPrecondition desc = volume in use", ErrorCode: code(9)}
			}),
			want: []expect{{"va.attachError", StatusProblem, []string{"volume in use", "90s ago", "gRPC code 9", "attached to another node in the backend"}}},
		},
		{
			name: "attachError about a missing CSINode (written by csi-attacher) → hint points at the node plugin",
			objs: edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) {
				va.Status.Attached = false
				va.Status.AttachError = &storagev1.VolumeError{Time: ago(time.Minute), Message: `CSINode "node-a" does not contain driver "csi.example.com": the driver's node plugin has not registered on that node yet`}
			}),
			want: []expect{{"va.attachError", StatusProblem, []string{"node plugin must register on node node-a"}}},
		},
		{
			name: "attachError DeadlineExceeded → hint says the operation may still be in progress",
			objs: edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) {
				va.Status.Attached = false
				va.Status.AttachError = &storagev1.VolumeError{Time: ago(time.Minute), Message: "context deadline exceeded", ErrorCode: code(4)}
			}),
			want: []expect{{"va.attachError", StatusProblem, []string{"may still be in progress"}}},
		},
		{
			name:   "VolumeAttachment deleting with the attacher finalizer → waiting for csi-attacher to detach",
			objs:   edit(edit(healthy(), "web", func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }), vaA, func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = agoPtr(3 * time.Minute) }),
			target: Target{Kind: TargetVA, Name: vaA},
			want: []expect{
				{"va.detaching", StatusWaiting, []string{kubenames.AttacherFinalizer(drv), "3m"}},
				{"node.volumesInUse", StatusWaiting, []string{"unmounted", "out-of-service"}},
			},
			healthy: true,
		},
		{
			name:   "detachError → problem with the driver's message",
			target: Target{Kind: TargetVA, Name: vaA},
			objs: edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) {
				va.DeletionTimestamp = agoPtr(time.Hour)
				va.Status.DetachError = &storagev1.VolumeError{Time: ago(time.Minute), Message: "backend unreachable", ErrorCode: code(14)}
			}),
			want: []expect{
				{"va.detachError", StatusProblem, []string{"backend unreachable", "ControllerUnpublishVolume"}},
				{"va.recreate", StatusInfo, []string{"app/web"}},
			},
		},
		{
			name:   "VolumeAttachment of another attacher → problem",
			target: Target{Kind: TargetVA, Name: vaA},
			objs:   edit(healthy(), vaA, func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "other.example.com" }),
			want:   []expect{{"va.attacher", StatusProblem, []string{"other.example.com"}}},
		},
		{
			name:   "explain va by unique prefix → found",
			target: Target{Kind: TargetVA, Name: vaA[:12]},
			objs:   healthy(), healthy: true,
			want: []expect{{"va.attached", StatusOK, nil}},
		},
		{
			name:   "explain va by ambiguous prefix → problem listing the candidates",
			target: Target{Kind: TargetVA, Name: "csi-"},
			objs:   append(healthy(), newVA(nodeB, true)),
			want:   []expect{{"va.exists", StatusProblem, []string{"matches 2", vaA}}},
		},
		{
			name:   "explain va not found → problem",
			target: Target{Kind: TargetVA, Name: "csi-nope"},
			objs:   healthy(),
			want:   []expect{{"va.exists", StatusProblem, []string{"csi-nope"}}},
		},
		{
			name:   "VolumeAttachment of a deleted PV, detaching → PV absence is only info, detach goes on from annotations",
			target: Target{Kind: TargetVA, Name: vaA},
			objs: edit(drop[*v1.PersistentVolume](healthy(), ""), vaA, func(va *storagev1.VolumeAttachment) {
				va.DeletionTimestamp = agoPtr(time.Minute)
				va.Annotations = map[string]string{annVolumeHandle: handle}
			}),
			want:    []expect{{"pv.exists", StatusInfo, []string{"annotations"}}, {"va.detaching", StatusWaiting, nil}},
			healthy: true,
		},
		{
			name:   "attached VolumeAttachment no Pod uses → waiting for the controller to detach",
			target: Target{Kind: TargetPVC, Namespace: ns, Name: "data"},
			objs:   edit(drop[*v1.Pod](healthy(), ""), nodeA, func(n *v1.Node) { n.Status.VolumesInUse = nil }),
			want:   []expect{{"va.attached", StatusWaiting, []string{"no running Pod"}}}, healthy: true,
		},
		{
			name: "attached but not yet in node.status.volumesAttached → waiting, kubelet cannot mount",
			objs: edit(healthy(), nodeA, func(n *v1.Node) { n.Status.VolumesAttached, n.Status.VolumesInUse = nil, nil }),
			want: []expect{{"node.volumesAttached", StatusWaiting, []string{kubenames.UniqueVolumeNamePrefix + drv + "^" + handle}}}, healthy: true,
		},
	})
}

func TestExplainPVTerminating(t *testing.T) {
	deleting := func(finalizers ...string) func(*v1.PersistentVolume) {
		return func(p *v1.PersistentVolume) { p.DeletionTimestamp, p.Finalizers = agoPtr(20*time.Minute), finalizers }
	}
	pvTarget := Target{Kind: TargetPV, Name: pvName}
	runScenarios(t, []scenario{
		{
			name:   "PV Terminating held by the attacher finalizer → problem naming the VolumeAttachment that still references it",
			target: pvTarget,
			objs:   edit(healthy(), pvName, deleting(kubenames.AttacherFinalizer(drv))),
			want:   []expect{{"pv.deleting", StatusProblem, []string{kubenames.AttacherFinalizer(drv), kubenames.VolumeAttachmentName(handle, drv, nodeA), nodeA, "20m"}}},
		},
		{
			name:   "PV Terminating with the attacher finalizer and no VolumeAttachment → problem, attacher must remove it; Lease checked",
			target: pvTarget,
			objs:   edit(drop[*v1.Pod](drop[*storagev1.VolumeAttachment](healthy(), ""), ""), pvName, deleting(kubenames.AttacherFinalizer(drv))),
			want: []expect{
				{"pv.deleting", StatusProblem, []string{"no VolumeAttachment references it", "orphaned publication", "external-attacher-orphans-", "kubectl patch pv"}},
				{"attacher.lease", StatusOK, nil},
			},
		},
		{
			name:   "PV Terminating held only by pv-protection → info, not the attacher's business",
			target: pvTarget,
			objs:   edit(healthy(), pvName, deleting("kubernetes.io/pv-protection")),
			want:   []expect{{"pv.deleting", StatusInfo, []string{"kubernetes.io/pv-protection"}}}, healthy: true,
		},
		{
			name:   "PV without claim and without VolumeAttachment → nothing to attach",
			target: pvTarget,
			objs: edit(drop[*storagev1.VolumeAttachment](healthy(), ""), pvName, func(p *v1.PersistentVolume) {
				p.Spec.ClaimRef = nil
				p.Status.Phase = v1.VolumeAvailable
			}),
			want: []expect{{"pv.claimRef", StatusInfo, []string{"not claimed"}}, {"volume.nodes", StatusOK, nil}}, healthy: true,
		},
		{
			name:   "PV not found → problem",
			target: Target{Kind: TargetPV, Name: "nope"},
			objs:   healthy(),
			want:   []expect{{"pv.exists", StatusProblem, []string{"nope"}}},
		},
	})
}

func TestExplainNodeAndAttacher(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	pending := func(objs []runtime.Object) []runtime.Object {
		return edit(objs, vaA, func(va *storagev1.VolumeAttachment) { va.Status.Attached = false })
	}
	runScenarios(t, []scenario{
		{
			name: "CSINode without the driver, attach pending → problem listing what is registered",
			objs: edit(pending(healthy()), nodeA, func(cn *storagev1.CSINode) {
				cn.Spec.Drivers = cn.Spec.Drivers[:0]
				cn.Spec.Drivers = append(cn.Spec.Drivers, storagev1.CSINodeDriver{Name: "other.csi", NodeID: "x"})
			}),
			want: []expect{{"csinode.driver", StatusProblem, []string{"does not list driver " + drv, "other.csi", "node-driver-registrar"}}},
		},
		{
			name: "CSINode missing, attach pending → problem",
			objs: drop[*storagev1.CSINode](pending(healthy()), ""),
			want: []expect{{"csinode.driver", StatusProblem, []string{"CSINode node-a not found"}}},
		},
		{
			name: "CSINode missing but the volume is attached → info only",
			objs: drop[*storagev1.CSINode](healthy(), ""),
			want: []expect{{"csinode.driver", StatusInfo, []string{"attached already"}}}, healthy: true,
		},
		{
			name:   "CSINode missing while detaching with a recorded node ID → info, detach does not need it",
			target: Target{Kind: TargetVA, Name: vaA},
			objs: edit(drop[*storagev1.CSINode](healthy(), ""), vaA, func(va *storagev1.VolumeAttachment) {
				va.DeletionTimestamp = agoPtr(time.Minute)
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "n-1"}
			}),
			want:    []expect{{"csinode.driver", StatusInfo, []string{"recorded node ID n-1"}}},
			healthy: true,
		},
		{
			name: "stale Lease → problem: the attacher is gone, hint names its namespace",
			objs: drop[*storagev1.CSINode](pending(edit(healthy(), "", func(l *coordLease) { l.Namespace = "storage"; l.Spec.RenewTime.Time = now.Add(-5 * time.Minute) })), ""),
			want: []expect{{"attacher.lease", StatusProblem, []string{"stale", "attacher-0", "5m", "kubectl -n storage"}}},
		},
		{
			name: "Lease without holder → problem",
			objs: edit(healthy(), "", func(l *coordLease) { l.Spec.HolderIdentity = nil }),
			want: []expect{{"attacher.lease", StatusProblem, []string{"no holder"}}},
		},
		// No Lease while an attach is pending: operator_test.go tells
		// leader election off from no attacher running.
		{
			name: "no Lease while all is attached → info",
			objs: drop[*coordLease](healthy(), ""),
			want: []expect{{"attacher.lease", StatusInfo, nil}}, healthy: true,
		},
		{
			name: "two Leases (old install) → the fresh one counts",
			objs: append(healthy(), newLease("old", time.Hour)),
			want: []expect{{"attacher.lease", StatusOK, []string{"kube-system"}}}, healthy: true,
		},
		{
			name: "node missing → problem, hint says to delete the Pod",
			objs: drop[*v1.Node](healthy(), ""),
			want: []expect{{"node.exists", StatusProblem, []string{"Node node-a not found", "delete the Pod"}}},
		},
		{
			name: "node NotReady → problem with reason and the out-of-service hint",
			objs: edit(healthy(), nodeA, func(n *v1.Node) {
				n.Status.Conditions[0].Status, n.Status.Conditions[0].Reason = v1.ConditionUnknown, "NodeStatusUnknown"
			}),
			want:   []expect{{"node.ready", StatusProblem, []string{"NodeStatusUnknown", kubenames.OutOfServiceTaintKey}}},
			absent: []string{"node"},
		},
		{
			name: "node without controller-managed annotation → problem naming the kubelet flag",
			objs: edit(healthy(), nodeA, func(n *v1.Node) { n.Annotations = nil }),
			want: []expect{{"node.managed", StatusProblem, []string{"--enable-controller-attach-detach"}}},
		},
		{
			name: "out-of-service taint on the pod's node → problem",
			objs: edit(healthy(), nodeA, func(n *v1.Node) {
				n.Spec.Taints = []v1.Taint{{Key: kubenames.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}}
			}),
			want: []expect{{"node.outOfService", StatusProblem, []string{"app/web", "kubectl taint node node-a " + kubenames.OutOfServiceTaintKey + "-"}}},
		},
		{
			name:   "out-of-service taint, no pod left → waiting for the forced detach",
			target: Target{Kind: TargetVA, Name: vaA},
			objs: edit(drop[*v1.Pod](healthy(), ""), nodeA, func(n *v1.Node) {
				n.Spec.Taints = []v1.Taint{{Key: kubenames.OutOfServiceTaintKey, Effect: v1.TaintEffectNoExecute}}
			}),
			want: []expect{{"node.outOfService", StatusWaiting, nil}}, healthy: true,
		},
		{
			name:   "volume still in volumesInUse blocks detach → waiting, hint lists how to find the pods",
			target: Target{Kind: TargetVA, Name: vaA},
			objs:   edit(drop[*v1.Pod](healthy(), ""), vaA, func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = agoPtr(time.Minute) }),
			want:   []expect{{"node.volumesInUse", StatusWaiting, []string{"spec.nodeName=node-a"}}}, healthy: true,
		},
		{
			name: "warning events on the pod and the VolumeAttachment are shown, newest first, at most three",
			objs: append(pending(healthy()),
				newEvent("Pod", ns, "web", "FailedAttachVolume", "AttachVolume.Attach failed for volume \"pv-data\""),
				newEvent("Pod", ns, "web", "Scheduled", "ignored: not a volume reason"),
				newEvent("VolumeAttachment", "", vaA, "AttachFailed", "rpc error: boom")),
			want:    []expect{{"events", StatusInfo, []string{"FailedAttachVolume x3", "AttachVolume.Attach failed"}}, {"events", StatusInfo, []string{"AttachFailed", "boom"}}},
			healthy: true,
		},
	})
}

func TestExplainMultiAttach(t *testing.T) {
	vaA := kubenames.VolumeAttachmentName(handle, drv, nodeA)
	// web runs on node-a with the volume attached; web-2 is scheduled to
	// node-b and wants it too.
	conflict := func(modes ...v1.PersistentVolumeAccessMode) []runtime.Object {
		objs := append(healthy(), newPod("web-2", nodeB, "data"), newNode(nodeB, false, false), newCSINode(nodeB, drv))
		return edit(objs, pvName, func(p *v1.PersistentVolume) { p.Spec.AccessModes = modes })
	}
	web2 := Target{Kind: TargetPod, Namespace: ns, Name: "web-2"}
	// noConflict: no multiattach finding, and nothing else wrong either.
	noConflict := func(name string, target Target, objs []runtime.Object) scenario {
		return scenario{name: name, target: target, objs: objs, absent: []string{"multiattach"}, healthy: true}
	}
	runScenarios(t, []scenario{
		{
			name:   "RWO volume attached on node-a, second pod on node-b → problem naming the conflicting pod and node",
			target: web2,
			objs:   conflict(v1.ReadWriteOnce),
			want: []expect{
				{"multiattach", StatusProblem, []string{"Multi-Attach", "ReadWriteOnce", "app/web-2", "node node-a", vaA, "Pod app/web on node node-a", "out-of-service"}},
				{"va.exists", StatusWaiting, []string{"multi-attach conflict"}},
			},
		},
		{
			name:   "RWOP volume behaves like RWO",
			target: web2,
			objs:   conflict(v1.ReadWriteOncePod),
			want:   []expect{{"multiattach", StatusProblem, []string{"ReadWriteOncePod"}}},
		},
		noConflict("RWX volume may be attached to both nodes → no conflict", web2, conflict(v1.ReadWriteMany)),
		noConflict("ROX volume → no conflict", web2, conflict(v1.ReadOnlyMany, v1.ReadWriteOnce)),
		{
			name:   "no VolumeAttachment yet anywhere but pods on two nodes → problem on the pod that waits",
			target: web2,
			objs:   edit(drop[*storagev1.VolumeAttachment](conflict(v1.ReadWriteOnce), ""), nodeA, func(n *v1.Node) { n.Status = v1.NodeStatus{} }),
			want:   []expect{{"multiattach", StatusProblem, []string{"used by Pod app/web on node node-a"}}},
		},
		noConflict("the node that holds the volume sees no conflict", podWeb, conflict(v1.ReadWriteOnce)),
		{
			name:   "pvc target walks every node: conflict reported for node-b",
			target: Target{Kind: TargetPVC, Namespace: ns, Name: "data"},
			objs:   conflict(v1.ReadWriteOnce),
			want:   []expect{{"multiattach", StatusProblem, []string{"node-b"}}, {"va.attached", StatusOK, []string{nodeA}}},
		},
		{
			name:   "pod on node-a gone, its VolumeAttachment's detach failing → problem naming the detach error, hint: fix it, keep the finalizer",
			target: web2,
			objs: edit(drop[*v1.Pod](conflict(v1.ReadWriteOnce), "web"), vaA, func(va *storagev1.VolumeAttachment) {
				va.DeletionTimestamp = agoPtr(time.Minute)
				va.Status.DetachError = &storagev1.VolumeError{Time: ago(10 * time.Second), Message: "rpc error: code = Internal desc = backend refuses the detach"}
			}),
			want: []expect{{"multiattach", StatusProblem, []string{"still attached to node node-a", vaA, "detaching, its detach failing: rpc error: code = Internal desc = backend refuses the detach",
				"explain va " + vaA, "Do not remove the VolumeAttachment's finalizer"}}},
		},
		noConflict("terminated pod on node-a does not count as a user", web2,
			edit(drop[*storagev1.VolumeAttachment](conflict(v1.ReadWriteOnce), ""), "web", func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded })),
	})
}
