package diagnose

import (
	"fmt"
	"regexp"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// createFailedMarker precedes the API server's answer in the
// FailedAttachVolume event that kube-controller-manager's attach/detach
// controller, and latch's (decide.CreateFailedPrefix), record on a Pod
// when its VolumeAttachment create fails: `AttachVolume.Attach failed for
// volume "<pv>" : kubernetes.io/csi: attacher.Attach failed: <answer>`.
const createFailedMarker = "kubernetes.io/csi: attacher.Attach failed: "

var (
	policyDenial  = regexp.MustCompile(`ValidatingAdmissionPolicy '([^']+)' with binding '([^']+)' denied request`)
	webhookDenial = regexp.MustCompile(`admission webhook "([^"]+)" denied the request`)
)

// explainCreateFailed reports, for an attachment whose VolumeAttachment
// does not exist while Pods on the node want it, the latest failed create
// of it that those Pods' events tell of. A refusal (an admission policy or
// webhook, RBAC, a quota, an invalid object) is a problem that lasts until
// somebody changes what refuses it; the controller retries with backoff
// meanwhile. Any other failure (a timeout) is a wait. Reports whether it
// found one.
func (w *walker) explainCreateFailed(a *attachment) bool {
	var latest *v1.Event
	for _, p := range a.wantedBy {
		namespace, name, _ := strings.Cut(p, "/")
		evs, _ := w.events(RefPod, namespace, name)
		for _, e := range evs {
			if e.Type != v1.EventTypeWarning || e.Reason != "FailedAttachVolume" || !strings.Contains(e.Message, createFailedMarker) {
				continue
			}
			if a.vol.pvName != "" && !strings.Contains(e.Message, fmt.Sprintf("for volume %q ", a.vol.pvName)) {
				continue
			}
			if latest == nil || eventTime(e).After(eventTime(latest)) {
				latest = e
			}
		}
	}
	if latest == nil {
		return false
	}
	_, answer, _ := strings.Cut(latest.Message, createFailedMarker)
	answer = strings.TrimSpace(answer)
	times := ""
	if latest.Count > 1 {
		times = fmt.Sprintf(", %d times", latest.Count)
	}
	f := Finding{Check: "va.createRefused", Object: "VolumeAttachment " + a.vaName, Status: StatusProblem,
		Message: fmt.Sprintf("the API server refused to create the VolumeAttachment for node %s (last %s ago%s, event on Pod %s/%s): %s",
			a.node, ageOrNever(w.s.Now, eventTime(latest)), times, latest.InvolvedObject.Namespace, latest.InvolvedObject.Name, answer),
		Hint: createRefusedHint(answer)}
	if !refusal(answer) {
		f.Check, f.Status = "va.createFailed", StatusWaiting
		f.Message = fmt.Sprintf("the last create of the VolumeAttachment for node %s failed (%s ago%s, event on Pod %s/%s): %s",
			a.node, ageOrNever(w.s.Now, eventTime(latest)), times, latest.InvolvedObject.Namespace, latest.InvolvedObject.Name, answer)
		f.Hint = "the attach/detach controller retries the create with backoff; if this lasts, read its log and check that the API server answers"
	}
	w.add(f)
	return true
}

// refusal reports whether the API server's answer refuses the create
// for a reason that a retry does not change.
func refusal(answer string) bool {
	for _, s := range []string{"is forbidden", "denied the request", "denied request", "is invalid", "exceeded quota"} {
		if strings.Contains(answer, s) {
			return true
		}
	}
	return false
}

// createRefusedHint names what refused the create and how to find it.
func createRefusedHint(answer string) string {
	const retried = "; the attach/detach controller retries with backoff and attaches once the create is admitted"
	if m := policyDenial.FindStringSubmatch(answer); m != nil {
		return fmt.Sprintf("ValidatingAdmissionPolicy %s, through its binding %s, denies the create: read its rule (kubectl get validatingadmissionpolicy %s -o yaml; kubectl get validatingadmissionpolicybinding %s -o yaml) and change it or the binding so that it admits the attach/detach controller's VolumeAttachments%s",
			m[1], m[2], m[1], m[2], retried)
	}
	if m := webhookDenial.FindStringSubmatch(answer); m != nil {
		return fmt.Sprintf("the admission webhook %s denies the create: find the configuration that names it (kubectl get validatingwebhookconfigurations,mutatingwebhookconfigurations -o yaml) and change its rules, or its service's decision, for VolumeAttachments%s",
			m[1], retried)
	}
	if strings.Contains(answer, `cannot create resource "volumeattachments"`) {
		return "the attach/detach controller's ServiceAccount may not create VolumeAttachments: its ClusterRole needs the rule {apiGroups: [storage.k8s.io], resources: [volumeattachments], verbs: [create]} (deploy/ has the full role)" + retried
	}
	if strings.Contains(answer, "exceeded quota") {
		return "a ResourceQuota counts VolumeAttachments and is used up: kubectl get resourcequota -A, then raise it or free some" + retried
	}
	return "an admission plugin, policy or webhook refuses the create: kubectl get validatingadmissionpolicies,validatingadmissionpolicybindings,validatingwebhookconfigurations,mutatingwebhookconfigurations, and read the one whose rules match VolumeAttachments" + retried
}
