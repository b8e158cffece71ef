package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// kcmUserAgent is how kube-controller-manager v1.36.3 introduces itself;
// it creates VolumeAttachments without a field manager, so the API server
// records the user agent's first word as the manager.
const kcmUserAgent = "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/0000000/attachdetach-controller"

// Two attach/detach controllers at once: VolumeAttachments created in turn
// by kube-controller-manager's (its user agent, no field manager) and by
// latch's (its field manager), read back from the real API server's
// managedFields. `latchctl status` names both managers, the latest
// kube-controller-manager object and the commands, and exits 1.
func TestStatusFindsTwoAttachDetachControllers(t *testing.T) {
	f := newFixture(t, "coexist")
	kcmCfg := cluster.RESTConfig()
	kcmCfg.UserAgent = kcmUserAgent
	kcmClient := kubernetes.NewForConfigOrDie(kcmCfg)

	create := func(client kubernetes.Interface, manager, node string) string {
		pv := f.volume("v-" + node)
		name := pv.Name
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: kubenames.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, f.driver, node)},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: f.driver, NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &name}},
		}
		va, err := client.StorageV1().VolumeAttachments().Create(f.ctx, va, metav1.CreateOptions{FieldManager: manager})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.forceDelete(va.Name) })
		return va.Name
	}
	// Creation timestamps have a resolution of one second: a pause makes
	// the turns visible.
	create(f.client, kube.AttachDetachFieldManager, f.node("a", true))
	time.Sleep(1100 * time.Millisecond)
	kcmVA := create(kcmClient, "", f.node("b", true))
	time.Sleep(1100 * time.Millisecond)
	create(f.client, kube.AttachDetachFieldManager, f.node("c", true))

	out, code := f.latchctl("status", "--driver", f.driver)
	if code != exitProblem {
		t.Errorf("exit code %d, want %d with two attach/detach controllers", code, exitProblem)
	}
	mustLine(t, out, "PROBLEM", "VolumeAttachment "+kcmVA, `"kube-controller-manager"`, `"`+kube.AttachDetachFieldManager+`"`)
	mustSay(t, out, "--controllers=*,-attachdetach")
	mustSay(t, out, "kubectl get volumeattachment "+kcmVA+" --show-managed-fields")

	out, _ = f.latchctl("status", "-o", "json", "--driver", f.driver)
	var doc struct {
		Items    []json.RawMessage
		Findings []struct{ Check, Object, Status, Hint string }
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Items) != 3 || len(doc.Findings) != 1 || doc.Findings[0].Check != "controllers.coexist" ||
		doc.Findings[0].Status != "problem" || doc.Findings[0].Object != "VolumeAttachment "+kcmVA || !strings.Contains(doc.Findings[0].Hint, "kubectl") {
		t.Errorf("status -o json: %d items, findings %+v; want 3 items and one controllers.coexist problem about %s", len(doc.Items), doc.Findings, kcmVA)
	}
}
