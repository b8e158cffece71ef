package deploy_test

import (
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/attacher"
)

// The chart's orphan-record Role limits get/list/watch/update to the
// ConfigMap names the attacher really uses (the chart's sanitizer matches
// the binary's), and grants get/list/watch/create/update on ConfigMaps
// whatever the values.
func TestHelmOrphanRoleNamesTheAttachersConfigMaps(t *testing.T) {
	drivers := []string{"Example.CSI/driver", "ebs.csi.aws.com", "ends-with."}
	for _, c := range []struct {
		name      string
		vals      map[string]any
		wantNames []string
	}{
		{"no driver names: any ConfigMap of the namespace", nil, nil},
		{"driverNames", map[string]any{"csiAttacher": map[string]any{"driverNames": []any{drivers[0], drivers[1], drivers[2]}}},
			[]string{attacher.OrphanRecordName(drivers[0]), attacher.OrphanRecordName(drivers[1]), attacher.OrphanRecordName(drivers[2])}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var role *rbacv1.Role
			for _, o := range mustHelmTemplate(t, "storage", c.vals) {
				if o.GetKind() == "Role" && o.GetName() == "latch-csi-attacher-orphans" {
					role = &rbacv1.Role{}
					if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role); err != nil {
						t.Fatal(err)
					}
				}
			}
			if role == nil {
				t.Fatal("Role latch-csi-attacher-orphans not rendered")
			}
			verbs := map[string][]string{}
			for _, r := range role.Rules {
				if !slices.Equal(r.Resources, []string{"configmaps"}) || !slices.Equal(r.APIGroups, []string{""}) {
					t.Errorf("rule %+v is not about configmaps", r)
				}
				for _, v := range r.Verbs {
					verbs[v] = r.ResourceNames
				}
			}
			for _, v := range []string{"get", "list", "watch", "create", "update"} {
				names, ok := verbs[v]
				if !ok {
					t.Errorf("verb %s not granted", v)
					continue
				}
				want := c.wantNames
				if v == "create" {
					want = nil // create cannot be limited by name
				}
				if !slices.Equal(names, want) {
					t.Errorf("%s limited to %q, want %q", v, names, want)
				}
			}
			if len(verbs) != 5 {
				t.Errorf("verbs = %v, want exactly get, list, watch, create, update", verbs)
			}
		})
	}
}
