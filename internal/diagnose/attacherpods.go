package diagnose

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// IsAttacherPod reports whether pod has a container that looks like a
// csi-attacher (latch's or upstream's external-attacher): its name or its
// image contains "attacher". latchctl reads these Pods when no Lease shows
// an attacher, to tell "leader election off" from "not running".
func IsAttacherPod(pod *v1.Pod) bool {
	return len(attacherContainers(pod)) > 0
}

func attacherContainers(pod *v1.Pod) []v1.Container {
	var out []v1.Container
	for _, c := range pod.Spec.Containers {
		if strings.Contains(c.Name, "attacher") || strings.Contains(c.Image, "attacher") {
			out = append(out, c)
		}
	}
	return out
}

// leaderElectionOn reports whether a container's command line turns
// --leader-election on (csi-attacher's and external-attacher's flag).
func leaderElectionOn(c v1.Container) bool {
	for _, arg := range append(slices.Clone(c.Command), c.Args...) {
		flag := strings.TrimLeft(arg, "-")
		if flag == "leader-election" || flag == "leader-election=true" || flag == "leader-election=1" {
			return true
		}
	}
	return false
}

// attacherPods returns the Pods with a csi-attacher container, sorted, and
// the read they come from.
func (w *walker) attacherPods() ([]*v1.Pod, Ref) {
	ref := Ref{Kind: RefAttacherPodList}
	if !w.known(ref, w.s.AttacherPodsListed) {
		return nil, ref
	}
	var out []*v1.Pod
	for _, p := range w.s.Pods {
		if p != nil && IsAttacherPod(p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *v1.Pod) int { return strings.Compare(key(a.Namespace, a.Name), key(b.Namespace, b.Name)) })
	return out, ref
}

// checkAttacherPodsCommand lists every Pod's csi-attacher arguments: a
// csi-attacher container without --leader-election means election is off.
const checkAttacherPodsCommand = `kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\t"}{.spec.containers[*].image}{"\t"}{.spec.containers[*].args}{"\n"}{end}' | grep -i attacher`

// explainNoLease says what a missing Lease means. latch's csi-attacher
// holds its Lease with or without --leader-election
// (internal/app/presence.go); upstream's external-attacher holds none
// without it. So when something waits for the attacher, the running Pods
// with a csi-attacher container tell "leader election is off" (one runs
// without --leader-election) from "no attacher of this driver runs" (none
// runs, or all run with leader election and would hold a Lease).
//
// A missing attacher is a problem when it is needed now, else (a detach
// that still waits for the kubelet) a waiting finding.
func (w *walker) explainNoLease(name, driver string, important, needed bool) {
	obj := "Lease " + name
	if !important {
		w.add(Finding{Check: "attacher.lease", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("no Lease %s in any namespace: leader election is off (an upstream external-attacher without --leader-election holds none; latch's csi-attacher holds it with or without leader election) or no csi-attacher of driver %s runs; nothing waits for it now", name, driver),
			Hint:    "to check which: " + checkAttacherPodsCommand})
		return
	}
	pods, ref := w.attacherPods()
	if why, ok := w.unreadable(ref); ok {
		w.add(Finding{Check: "attacher.lease", Object: obj, Status: StatusWaiting,
			Message: fmt.Sprintf("no Lease %s in any namespace: leader election is off (an upstream external-attacher without --leader-election holds none; latch's csi-attacher holds it with or without leader election) or no csi-attacher of driver %s runs; could not list Pods to tell which (%s)", name, driver, why),
			Hint:    "check which (a csi-attacher container without --leader-election means election is off; none means no attacher runs): " + checkAttacherPodsCommand})
		return
	}
	var noElection, withElection, notRunning []string
	var firstNoElection, firstNotRunning *v1.Pod
	var firstContainer string
	for _, p := range pods {
		if p.Status.Phase != v1.PodRunning || p.DeletionTimestamp != nil {
			phase := string(p.Status.Phase)
			if p.DeletionTimestamp != nil {
				phase = "terminating"
			}
			notRunning = append(notRunning, fmt.Sprintf("%s (%s)", key(p.Namespace, p.Name), phase))
			if firstNotRunning == nil {
				firstNotRunning = p
			}
			continue
		}
		for _, c := range attacherContainers(p) {
			desc := fmt.Sprintf("Pod %s (container %s, image %s)", key(p.Namespace, p.Name), c.Name, c.Image)
			if leaderElectionOn(c) {
				withElection = append(withElection, desc)
				continue
			}
			noElection = append(noElection, desc)
			if firstNoElection == nil {
				firstNoElection, firstContainer = p, c.Name
			}
		}
	}
	if firstNoElection != nil {
		w.add(Finding{Check: "attacher.lease", Object: obj, Status: StatusInfo,
			Message: fmt.Sprintf("no Lease %s: leader election is off — %s run(s) without --leader-election, and an upstream external-attacher holds no Lease then (latch's csi-attacher holds it even without leader election), so the Lease cannot show whether one of them serves driver %s",
				name, strings.Join(noElection, ", "), driver),
			Hint: fmt.Sprintf("check that it serves driver %s and what it does with the VolumeAttachment: kubectl -n %s logs %s -c %s",
				driver, firstNoElection.Namespace, firstNoElection.Name, firstContainer)})
		return
	}
	msg := fmt.Sprintf("no csi-attacher of driver %s runs: no Lease %s in any namespace, and ", driver, name)
	switch {
	case len(withElection) > 0:
		msg += fmt.Sprintf("the running csi-attacher containers (%s) all run with --leader-election, so each holds a Lease of its own driver", strings.Join(withElection, ", "))
	default:
		msg += "no Pod runs a csi-attacher container"
	}
	hint := fmt.Sprintf("deploy or fix the controller Pod of driver %s with its csi-attacher sidecar: kubectl get csidriver %s, then kubectl get deployments,statefulsets -A | grep -i attacher", driver, driver)
	if firstNotRunning != nil {
		msg += "; not running: " + strings.Join(notRunning, ", ")
		hint = fmt.Sprintf("see why the csi-attacher Pod does not run: kubectl -n %s describe pod %s (and kubectl get csidriver %s)", firstNotRunning.Namespace, firstNotRunning.Name, driver)
	}
	status := StatusProblem
	if !needed {
		status = StatusWaiting
	}
	w.add(Finding{Check: "attacher.lease", Object: obj, Status: status, Message: msg, Hint: hint})
}
