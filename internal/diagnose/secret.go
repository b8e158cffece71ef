package diagnose

import (
	"fmt"
	"regexp"
	"strings"
)

// secretErrorRE matches csi-attacher's attachError about the
// controller-publish secret (internal/attacher/decide BeforeCall):
// "controller publish secret <ns>/<name> not found" and
// "controller publish secret <ns>/<name>: csi-attacher is not allowed to
// read it (...)".
var secretErrorRE = regexp.MustCompile(`controller publish secret ([^/\s:]+)/([^\s:]+)(:| not found)`)

// serviceAccountRE finds the user the API server refused, in its
// Forbidden message quoted by the attachError.
var serviceAccountRE = regexp.MustCompile(`User "(system:serviceaccount:[^"]+)"`)

// secretHint is the next step for an attachError about the
// controller-publish secret: it names the Secret (from the message, else
// the PV's spec.csi.controllerPublishSecretRef) and the command that
// checks it. ok is false when msg is not about the secret.
func secretHint(msg string, vol *volume) (hint string, ok bool) {
	var namespace, name string
	missing := false
	if m := secretErrorRE.FindStringSubmatch(msg); m != nil {
		namespace, name, missing = m[1], m[2], m[3] != ":"
	} else {
		// Another wording of the same errors: the PV names the Secret.
		lower := strings.ToLower(msg)
		ref := vol.publishSecret
		if ref == nil || !strings.Contains(lower, "secret") {
			return "", false
		}
		switch {
		case strings.Contains(lower, "forbidden"), strings.Contains(lower, "not allowed"):
		case strings.Contains(lower, "not found"):
			missing = true
		default:
			return "", false
		}
		namespace, name = ref.Namespace, ref.Name
	}
	where := "spec.csi.controllerPublishSecretRef of the volume"
	if vol.pvName != "" {
		where = "spec.csi.controllerPublishSecretRef of " + vol.object
	}
	if missing {
		return fmt.Sprintf("Secret %s/%s, named by %s, does not exist: check it with kubectl -n %s get secret %s, then create it or fix the reference; csi-attacher retries on its own",
			namespace, name, where, namespace, name), true
	}
	as := "system:serviceaccount:<attacher-namespace>:<attacher-serviceaccount>"
	if sa := serviceAccountRE.FindStringSubmatch(msg); sa != nil {
		as = sa[1]
	}
	return fmt.Sprintf("csi-attacher may not read Secret %s/%s (named by %s): check its RBAC with kubectl auth can-i get secret/%s -n %s --as=%s, then grant get on that Secret (a Role and RoleBinding in namespace %s, or the install's Secret access setting, see docs/csi-attacher.md)",
		namespace, name, where, name, namespace, as, namespace), true
}
