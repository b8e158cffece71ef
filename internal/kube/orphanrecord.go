package kube

import "fmt"

// OrphanRecordRule is the RBAC that csi-attacher of driver needs on its
// orphan record (OrphanRecordName) in namespace, as one line an operator
// can paste into a Role's rules: get, list, watch and update limited to
// that ConfigMap's name, and create, which Kubernetes cannot limit to a
// name. csi-attacher's errors and events and latchctl's finding print it.
func OrphanRecordRule(namespace, driver string) string {
	return fmt.Sprintf(`in a Role in namespace %q bound to csi-attacher's ServiceAccount: {apiGroups: [""], resources: ["configmaps"], resourceNames: [%q], verbs: ["get", "list", "watch", "update"]} and {apiGroups: [""], resources: ["configmaps"], verbs: ["create"]}`,
		namespace, OrphanRecordName(driver))
}
