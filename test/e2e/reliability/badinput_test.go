package reliability_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

func (e *env) va(name, node string, src storagev1.VolumeAttachmentSource) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: e.driver, NodeName: node, Source: src},
	}
}

func (e *env) rawPV(name string, mod func(*v1.PersistentVolume)) string {
	e.t.Helper()
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: e.driver, VolumeHandle: name,
			}},
		},
	}
	mod(pv)
	if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return name
}

// TestBadInput_volumeAttachmentsFailWithAClearErrorAndNoDriverCall covers
// the attacher's bad inputs not covered in test/e2e/attacher (see
// docs/reliability.md for the full table).
func TestBadInput_volumeAttachmentsFailWithAClearErrorAndNoDriverCall(t *testing.T) {
	e := newEnv(t, options{noController: true})
	node := e.addNode("n1")
	bare := e.prefix + "-bare"
	if err := e.kubelet.AddNode(e.ctx, localcluster.NodeConfig{Name: bare, Drivers: map[string]string{"other.csi.test": "x"}}); err != nil {
		t.Fatal(err)
	}
	e.nodes = append(e.nodes, bare)

	notCSI := e.rawPV(e.prefix+"-nfs", func(pv *v1.PersistentVolume) {
		pv.Spec.CSI = nil
		pv.Spec.NFS = &v1.NFSVolumeSource{Server: "nfs.invalid", Path: "/x"}
	})
	otherDriver := e.rawPV(e.prefix+"-other", func(pv *v1.PersistentVolume) { pv.Spec.CSI.Driver = "other.csi.test" })
	deleting := e.rawPV(e.prefix+"-deleting", func(pv *v1.PersistentVolume) { pv.Finalizers = []string{"example.com/hold"} })
	if err := e.client.CoreV1().PersistentVolumes().Delete(e.ctx, deleting, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		_, _ = e.client.CoreV1().PersistentVolumes().Patch(e.ctx, deleting, "application/merge-patch+json", patch, metav1.PatchOptions{})
	})
	good := e.rawPV(e.prefix+"-good", func(*v1.PersistentVolume) {})

	cases := []struct {
		name, pv, node string
		want           string // substring of the attachError
	}{
		{"PV is not a CSI volume", notCSI, node, fmt.Sprintf("PersistentVolume %q is not a CSI volume", notCSI)},
		{"PV of another driver", otherDriver, node, fmt.Sprintf("PersistentVolume %q belongs to CSI driver %q", otherDriver, "other.csi.test")},
		{"PV being deleted", deleting, node, fmt.Sprintf("PersistentVolume %q is being deleted", deleting)},
		{"CSINode without the driver", good, bare, fmt.Sprintf("CSINode %q does not contain driver %q", bare, e.driver)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("%s-bad%d", e.prefix, i)
			pv := c.pv
			if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, e.va(name, c.node, storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			var va *storagev1.VolumeAttachment
			e.eventually(30*time.Second, "attachError on "+name, func() bool {
				v, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
				va = v
				return err == nil && v.Status.AttachError != nil
			})
			if msg := va.Status.AttachError.Message; !strings.Contains(msg, c.want) {
				t.Errorf("attachError = %q, want it to contain %q", msg, c.want)
			}
			if va.Status.Attached {
				t.Errorf("VolumeAttachment marked attached")
			}
			e.eventually(10*time.Second, "AttachFailed event on "+name, func() bool {
				evs, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
				return err == nil && slices.ContainsFunc(evs.Items, func(ev v1.Event) bool {
					return ev.Reason == attacher.EventAttachFailed && strings.Contains(ev.Message, c.want)
				})
			})
			if n := len(e.mock.CallsTo("ControllerPublishVolume")); n != 0 {
				t.Errorf("the driver was called %d times for a VolumeAttachment that cannot be attached", n)
			}
			// Deleting it is not blocked by the error.
			if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			e.eventually(30*time.Second, name+" gone", func() bool { return len(e.vas()) == 0 })
		})
	}

	// The API server itself rejects sources it cannot accept.
	pv := good
	inline := &v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: e.driver}}}
	for what, va := range map[string]*storagev1.VolumeAttachment{
		"neither source":                 e.va(e.prefix+"-neither", node, storagev1.VolumeAttachmentSource{}),
		"both sources":                   e.va(e.prefix+"-both", node, storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv, InlineVolumeSpec: inline}),
		"empty node name":                e.va(e.prefix+"-nonode", "", storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}),
		"inline spec without its handle": e.va(e.prefix+"-inline", node, storagev1.VolumeAttachmentSource{InlineVolumeSpec: inline}),
	} {
		if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err == nil {
			t.Errorf("%s: the API server accepted %+v; the attacher's own check (decide tests) is then the only guard", what, va.Spec.Source)
			_ = e.client.StorageV1().VolumeAttachments().Delete(e.ctx, va.Name, metav1.DeleteOptions{})
		}
	}

	// A huge volume context reaches the driver intact.
	huge := e.rawPV(e.prefix+"-huge", func(pv *v1.PersistentVolume) {
		pv.Spec.CSI.VolumeAttributes = map[string]string{}
		for i := range 200 {
			pv.Spec.CSI.VolumeAttributes[fmt.Sprintf("key-%03d", i)] = strings.Repeat("x", 1024)
		}
	})
	name := e.prefix + "-huge"
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, e.va(name, node, storagev1.VolumeAttachmentSource{PersistentVolumeName: &huge}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the VolumeAttachment with a 200 KiB volume context attached", func() bool {
		v, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && v.Status.Attached
	})
	if calls := e.mock.CallsTo("ControllerPublishVolume"); len(calls) != 1 || calls[0].Code != codes.OK {
		t.Errorf("publish calls = %+v, want one successful call", calls)
	}
	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, name+" gone", func() bool { return len(e.vas()) == 0 })
	if got := e.mock.Published(huge); len(got) != 0 {
		t.Errorf("%s still published to %v", huge, got)
	}

	// An empty controller-publish secret is passed on as no secrets (the
	// driver decides whether that is enough), like upstream; attach and
	// detach both work.
	if _, err := e.client.CoreV1().Secrets(e.ns).Create(e.ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "empty"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	emptySecret := e.rawPV(e.prefix+"-emptysecret", func(pv *v1.PersistentVolume) {
		pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: e.ns, Name: "empty"}
	})
	name = e.prefix + "-emptysecret"
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, e.va(name, node, storagev1.VolumeAttachmentSource{PersistentVolumeName: &emptySecret}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the VolumeAttachment with an empty secret attached", func() bool {
		v, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && v.Status.Attached && v.Annotations[attacher.AnnSecretRef] == e.ns+"/empty"
	})
	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, name+" gone", func() bool { return len(e.vas()) == 0 })
	if got := e.mock.Published(emptySecret); len(got) != 0 {
		t.Errorf("%s still published to %v", emptySecret, got)
	}
}

func TestBadInput_unusualDriverNameGetsAValidSanitizedFinalizer(t *testing.T) {
	// Kubernetes allows lowercase DNS subdomains up to 63 characters; dots
	// and hyphen runs become '-' in the finalizer and Lease name.
	driver := worlds.NextPrefix() + ".weird--driver.name."
	driver += strings.Repeat("x", 63-len(driver))
	e := newEnv(t, options{driver: driver})
	node := e.addNode("n1")
	pv := e.volume("v")
	e.pod("p", node, pv)
	e.waitAttached(pv, node)
	va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, e.vaName(pv, node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := kubenames.AttacherFinalizer(driver)
	if !slices.Contains(va.Finalizers, want) {
		t.Errorf("finalizers = %v, want %q", va.Finalizers, want)
	}
	if errs := validation.IsQualifiedName(want); len(errs) != 0 {
		t.Errorf("finalizer %q is not a qualified name: %v", want, errs)
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}

func TestBadInput_podsWithBrokenClaimsGetNoVolumeAttachmentAndNothingCrashes(t *testing.T) {
	e := newEnv(t, options{})
	node := e.addNode("n1")
	// A PVC bound to a PV whose claimRef names another claim, from the
	// PV's creation on. (Patched in after a bound creation, the
	// controller's PV cache could still hold the matching claimRef when
	// the Pod came, and a VolumeAttachment was made: seen in a CI run.)
	pv := e.prefix + "-mismatch"
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, localcluster.VolumeSpec{Namespace: e.ns, Name: pv, Driver: e.driver,
		ClaimRef: &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: "someone-else", UID: "00000000-0000-0000-0000-000000000000"}}); err != nil {
		t.Fatal(err)
	}
	e.pod("mismatch", node, pv)
	e.pod("missing", node, e.prefix+"-nosuchclaim")
	good := e.volume("good")
	e.pod("good", node, good)
	e.waitAttached(good, node)
	time.Sleep(2 * time.Second)
	for _, va := range e.vas() {
		if src := ptrStr(va.Spec.Source.PersistentVolumeName); src != good {
			t.Errorf("a VolumeAttachment was made for %s", src)
		}
	}
	// The missing claim appears: the Pod's volume attaches.
	late := e.prefix + "-nosuchclaim"
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, localcluster.VolumeSpec{Namespace: e.ns, Name: late, Driver: e.driver}); err != nil {
		t.Fatal(err)
	}
	e.waitAttached(late, node)
	e.teardownClean()
}
