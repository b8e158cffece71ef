package diagnose

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// attachment is one volume on one node, with what is known about it.
type attachment struct {
	vol      *volume
	node     string
	nodeObj  *v1.Node
	va       *storagev1.VolumeAttachment
	vaName   string   // expected (or actual) VolumeAttachment name
	wantedBy []string // "ns/pod" of Pods on the node that use the volume
	// wantedPods are those Pods, in the order of wantedBy.
	wantedPods []*v1.Pod
	// wantKnown is false when the Pods using the volume cannot be known
	// (a PV without a PVC).
	wantKnown bool
}

func (a *attachment) wanted() bool { return len(a.wantedBy) > 0 }

// detachBlockedByKubelet reports whether the VolumeAttachment is being
// deleted while the node still reports the volume in use: the attacher is
// not needed before the kubelet unmounts it.
func (a *attachment) detachBlockedByKubelet() bool {
	if a.va == nil || a.va.DeletionTimestamp == nil || a.nodeObj == nil {
		return false
	}
	return slices.Contains(a.nodeObj.Status.VolumesInUse, kubenames.UniqueVolumeName(a.vol.driver, a.vol.handle))
}

// pending reports whether csi-attacher still has work to do.
func (a *attachment) pending() bool {
	return a.va != nil && (a.va.DeletionTimestamp != nil || !a.va.Status.Attached)
}

// explainAttachment explains vol on node; va is the VolumeAttachment when
// the caller already has it (explain va), else it is looked up.
func (w *walker) explainAttachment(vol *volume, node string, va *storagev1.VolumeAttachment) {
	a := &attachment{vol: vol, node: node, va: va, wantKnown: usersKnown(vol)}
	if a.va == nil {
		a.va = w.findVA(vol, node)
	}
	a.vaName = kubenames.VolumeAttachmentName(vol.handle, vol.driver, node)
	if a.va != nil {
		a.vaName = a.va.Name
	}
	users := w.users(vol)
	slices.SortFunc(users, func(x, y *v1.Pod) int { return strings.Compare(key(x.Namespace, x.Name), key(y.Namespace, y.Name)) })
	for _, pod := range users {
		if pod.Spec.NodeName == node {
			a.wantedBy = append(a.wantedBy, key(pod.Namespace, pod.Name))
			a.wantedPods = append(a.wantedPods, pod)
		}
	}
	a.nodeObj = w.node(node)

	w.explainNode(a)
	// A node that does not exist has no CSINode either: one finding says
	// so, not a second one about the driver's registration.
	if a.nodeObj != nil || w.nodeUnreadable(node) {
		w.explainCSINode(a)
	}
	conflict := w.explainMultiAttach(a)
	w.explainVAState(a, conflict)
	w.explainLease(vol.driver, a.pending() || (a.va == nil && a.wanted()), !a.detachBlockedByKubelet())
	w.explainNodeVolumes(a)
	w.explainMount(a)
	if a.va != nil {
		w.explainEvents(RefVA, "", a.va.Name, "VolumeAttachment "+a.va.Name, nil)
	}
}

func (w *walker) findVA(vol *volume, node string) *storagev1.VolumeAttachment {
	name := kubenames.VolumeAttachmentName(vol.handle, vol.driver, node)
	var match *storagev1.VolumeAttachment
	for _, va := range w.vasOf(vol) {
		if va.Name == name {
			return va
		}
		if va.Spec.NodeName == node && match == nil {
			match = va
		}
	}
	return match
}

func (w *walker) explainNode(a *attachment) {
	obj := "Node " + a.node
	n := a.nodeObj
	if n == nil {
		hint := "the Pod is bound to a node that does not exist; delete the Pod so that its controller re-creates it elsewhere: " + deletePodsCommand(a.wantedBy)
		if !a.wanted() {
			hint = fmt.Sprintf("the attach/detach controller detaches volumes from deleted nodes; if VolumeAttachment %s stays, check that the controller runs: kubectl get pods -A -l app.kubernetes.io/name=latch-attachdetach-controller", a.vaName)
		}
		w.add(w.notFound(Ref{Kind: RefNode, Name: a.node}, "node.exists", obj, fmt.Sprintf("Node %s not found", a.node), hint))
		return
	}
	healthy := true
	if ready := readyCondition(n); ready == nil || ready.Status != v1.ConditionTrue {
		healthy = false
		msg := fmt.Sprintf("Node %s is not Ready", a.node)
		if ready != nil {
			msg = fmt.Sprintf("Node %s is not Ready (Ready=%s, reason %s, for %s)", a.node, ready.Status, ready.Reason, age(w.s.Now, ready.LastTransitionTime.Time))
		}
		w.add(Finding{Check: "node.ready", Object: obj, Status: StatusProblem,
			Message: msg + ": its kubelet cannot mount volumes nor report that it unmounted them",
			Hint: fmt.Sprintf("bring the node back; if it is down for good, taint it so its volumes are detached at once: kubectl taint node %s %s=nodeshutdown:NoExecute (otherwise the attach/detach controller force-detaches 6 minutes after the node became NotReady)",
				a.node, kubenames.OutOfServiceTaintKey)})
	}
	if _, ok := n.Annotations[kubenames.ControllerManagedAttachAnnotation]; !ok {
		healthy = false
		w.add(Finding{Check: "node.managed", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("Node %s lacks annotation %s: the attach/detach controller does not attach or detach its volumes and expects its kubelet to do so", a.node, kubenames.ControllerManagedAttachAnnotation),
			Hint:    "run the kubelet with --enable-controller-attach-detach=true (the default) and restart it"})
	}
	for _, t := range n.Spec.Taints {
		if t.Key != kubenames.OutOfServiceTaintKey {
			continue
		}
		healthy = false
		f := Finding{Check: "node.outOfService", Object: obj,
			Message: fmt.Sprintf("Node %s has taint %s=%s:%s: its volumes are detached without waiting for the kubelet to unmount them", a.node, t.Key, t.Value, t.Effect)}
		switch {
		case a.wanted():
			f.Status = StatusProblem
			f.Message += fmt.Sprintf("; Pod(s) %s on it will not get the volume", strings.Join(a.wantedBy, ", "))
			f.Hint = fmt.Sprintf("remove the taint once the node is healthy again: kubectl taint node %s %s-", a.node, kubenames.OutOfServiceTaintKey)
		case a.va != nil:
			f.Status = StatusWaiting
			f.Hint = "the attach/detach controller deletes the VolumeAttachment; csi-attacher then detaches"
		default:
			f.Status = StatusInfo
		}
		w.add(f)
	}
	if healthy {
		w.add(Finding{Check: "node", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("Node %s is Ready and managed by the attach/detach controller", a.node)})
	}
}

// nodeUnreadable reports whether reading node name was refused: then
// nothing is known about it, and its CSINode is still worth a look.
func (w *walker) nodeUnreadable(name string) bool {
	_, ok := w.unreadable(Ref{Kind: RefNode, Name: name})
	return ok
}

// deletePodsCommand is the kubectl command that deletes the Pods ("ns/name").
func deletePodsCommand(pods []string) string {
	cmds := make([]string, 0, len(pods))
	for _, p := range pods {
		ns, name, _ := strings.Cut(p, "/")
		cmds = append(cmds, fmt.Sprintf("kubectl delete pod -n %s %s", ns, name))
	}
	return strings.Join(cmds, "; ")
}

func readyCondition(n *v1.Node) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == v1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// explainCSINode checks that the driver's node plugin registered: the
// attacher needs the node ID to publish (and to unpublish, unless it
// recorded it in the VA's node-id annotation).
func (w *walker) explainCSINode(a *attachment) {
	obj := "CSINode " + a.node
	driver := a.vol.driver
	cn := w.csiNode(a.node)
	var registered []string
	nodeID := ""
	if cn != nil {
		for _, d := range cn.Spec.Drivers {
			registered = append(registered, d.Name)
			if d.Name == driver {
				nodeID = d.NodeID
			}
		}
	}
	if nodeID != "" {
		w.add(Finding{Check: "csinode.driver", Object: obj, Status: StatusOK,
			Message: fmt.Sprintf("driver %s is registered on node %s with node ID %s", driver, a.node, nodeID)})
		return
	}
	msg := fmt.Sprintf("CSINode %s does not list driver %s (it lists: %s): the driver's node plugin has not registered on that node", a.node, driver, orNone(registered))
	if cn == nil {
		if why, ok := w.unreadable(Ref{Kind: RefCSINode, Name: a.node}); ok {
			w.add(Finding{Check: "csinode.driver", Object: obj, Status: StatusInfo, Message: fmt.Sprintf("could not read CSINode %s: %s", a.node, why)})
			return
		}
		msg = fmt.Sprintf("CSINode %s not found: the driver's node plugin (and kubelet plugin registration) has not registered node %s", a.node, a.node)
	}
	f := Finding{Check: "csinode.driver", Object: obj, Message: msg}
	switch {
	case a.va != nil && a.va.Status.Attached && a.va.DeletionTimestamp == nil:
		f.Status = StatusInfo
		f.Message += "; the volume is attached already, but the next attach to this node will wait for it"
	case a.va != nil && a.va.DeletionTimestamp != nil && a.va.Annotations[kubenames.VANodeIDAnnotation] != "":
		f.Status = StatusInfo
		f.Message += fmt.Sprintf("; detach does not need it, the VolumeAttachment recorded node ID %s", a.va.Annotations[kubenames.VANodeIDAnnotation])
	case a.va == nil && !a.wanted():
		f.Status = StatusInfo
	default:
		f.Status = StatusProblem
		f.Hint = fmt.Sprintf("check the driver's node DaemonSet Pod on node %s (its node-driver-registrar container logs); csi-attacher retries as soon as the CSINode changes", a.node)
	}
	w.add(f)
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// explainMultiAttach reports a ReadWriteOnce(Pod) volume that a Pod on this
// node wants while it is attached to, or used on, another node. It returns
// whether such a conflict exists (it explains a missing VolumeAttachment).
func (w *walker) explainMultiAttach(a *attachment) bool {
	if !exclusive(a.vol.modes) || !a.wanted() {
		return false
	}
	if a.va != nil && a.va.Status.Attached {
		return false // this node won; the conflict, if any, is the other node's
	}
	var elsewhere, failing []string
	otherNodes := map[string]bool{}
	for _, va := range w.vasOf(a.vol) {
		if va.Spec.NodeName == a.node || (!va.Status.Attached && !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(a.vol.driver))) {
			continue
		}
		state := vaState(va)
		if e := va.Status.DetachError; va.DeletionTimestamp != nil && e != nil {
			// The wait lasts as long as that detach fails.
			state += ", its detach failing: " + e.Message
			failing = append(failing, va.Name)
		}
		elsewhere = append(elsewhere, fmt.Sprintf("node %s (VolumeAttachment %s, %s)", va.Spec.NodeName, va.Name, state))
		otherNodes[va.Spec.NodeName] = true
	}
	var users []string
	for _, pod := range w.users(a.vol) {
		if pod.Spec.NodeName == "" || pod.Spec.NodeName == a.node {
			continue
		}
		u := fmt.Sprintf("Pod %s on node %s", key(pod.Namespace, pod.Name), pod.Spec.NodeName)
		if pod.DeletionTimestamp != nil {
			u += " (terminating)"
		}
		users = append(users, u)
		otherNodes[pod.Spec.NodeName] = true
	}
	if len(elsewhere) == 0 && len(users) == 0 {
		return false
	}
	msg := fmt.Sprintf("Multi-Attach: volume %s has access modes %s and can be attached to one node at a time, but Pod(s) %s on node %s want it while",
		a.vol.object, modesString(a.vol.modes), strings.Join(a.wantedBy, ", "), a.node)
	if len(elsewhere) > 0 {
		msg += " it is still attached to " + strings.Join(elsewhere, "; ")
		if len(users) > 0 {
			msg += " and"
		}
	}
	if len(users) > 0 {
		msg += " it is used by " + strings.Join(users, ", ")
	}
	others := sortedKeys(otherNodes)
	taintNode := "<node>"
	if len(others) == 1 {
		taintNode = others[0]
	}
	hint := fmt.Sprintf("the volume moves only after the Pods on %s are gone and it is detached there: delete or scale down those Pods; if that node is down, taint it so the volume is detached at once: kubectl taint node %s %s=nodeshutdown:NoExecute. Use ReadWriteMany if the storage supports it and several nodes must share the volume",
		strings.Join(others, ", "), taintNode, kubenames.OutOfServiceTaintKey)
	if len(failing) > 0 {
		hint = fmt.Sprintf("the detach there fails: fix what the driver says (latchctl explain va %s); the volume attaches here as soon as a retry succeeds. Do not remove the VolumeAttachment's finalizer: the volume would be published to two nodes. %s",
			strings.Join(failing, ", "), hint)
	}
	w.add(Finding{Check: "multiattach", Object: a.vol.object, Status: StatusProblem, Message: msg, Hint: hint})
	return true
}

func modesString(modes []v1.PersistentVolumeAccessMode) string {
	s := make([]string, len(modes))
	for i, m := range modes {
		s[i] = string(m)
	}
	return strings.Join(s, ",")
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
