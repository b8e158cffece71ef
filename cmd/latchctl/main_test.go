package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// One API server for the whole package; every test works in a namespace,
// with node, PV and driver names of its own.
var cluster *localcluster.Cluster

func TestMain(m *testing.M) { os.Exit(localcluster.RunTestMain(m, &cluster)) }

// fixture builds stuck situations by hand: no controller runs, so whatever
// the test writes stays as written.
type fixture struct {
	t          *testing.T
	ctx        context.Context
	client     kubernetes.Interface
	kubelet    *localcluster.Kubelet
	ns         string
	driver     string
	kubeconfig string
}

func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	client := cluster.Client()
	f := &fixture{t: t, ctx: ctx, client: client, kubelet: localcluster.NewKubelet(client),
		ns: "lc-" + name, driver: name + ".csi.test", kubeconfig: filepath.Join(t.TempDir(), "kubeconfig")}
	if err := cluster.WriteKubeconfig(f.kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.CreateNamespace(ctx, client, f.ns); err != nil {
		t.Fatal(err)
	}
	return f
}

// node registers a Ready, managed node whose CSINode lists the fixture's
// driver when withDriver is set; it returns the node's cluster-wide name.
func (f *fixture) node(name string, withDriver bool) string {
	f.t.Helper()
	cfg := localcluster.NodeConfig{Name: f.ns + "-" + name, Drivers: map[string]string{}}
	if withDriver {
		cfg.Drivers[f.driver] = "id-" + name
	}
	if err := f.kubelet.AddNode(f.ctx, cfg); err != nil {
		f.t.Fatal(err)
	}
	return cfg.Name
}

// volume creates a bound PV/PVC pair. Both are named <ns>-<name>
// (CreateBoundVolume gives them one name, and PVs are cluster-scoped).
func (f *fixture) volume(name string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	f.t.Helper()
	name = f.ns + "-" + name
	pv, _, err := localcluster.CreateBoundVolume(f.ctx, f.client, localcluster.VolumeSpec{
		Namespace: f.ns, Name: name, Driver: f.driver, Handle: name + "-handle", AccessModes: modes})
	if err != nil {
		f.t.Fatal(err)
	}
	return pv
}

func (f *fixture) pod(name, node string, claims ...string) {
	f.t.Helper()
	if _, err := f.client.CoreV1().Pods(f.ns).Create(f.ctx, localcluster.NewPod(f.ns, name, node, claims...), metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// va creates the VolumeAttachment the attach/detach controller would
// create for pv on node, with the attacher's finalizer, and sets status.
func (f *fixture) va(pv *v1.PersistentVolume, node string, status storagev1.VolumeAttachmentStatus) *storagev1.VolumeAttachment {
	f.t.Helper()
	name := pv.Name
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name:       kubenames.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, f.driver, node),
			Finalizers: []string{kubenames.AttacherFinalizer(f.driver)},
		},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: f.driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &name}},
	}
	va, err := f.client.StorageV1().VolumeAttachments().Create(f.ctx, va, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	va, err = f.client.StorageV1().VolumeAttachments().Patch(f.ctx, va.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		f.t.Fatalf("patch status of VolumeAttachment %s: %v", va.Name, err)
	}
	f.t.Cleanup(func() { f.forceDelete(va.Name) })
	return va
}

// forceDelete removes a VolumeAttachment a test left with finalizers, so
// that `status` of other tests stays unaffected (they filter by driver
// anyway).
func (f *fixture) forceDelete(name string) {
	ctx := context.Background()
	_, _ = f.client.StorageV1().VolumeAttachments().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	_ = f.client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{})
}

// nodeVolumes sets the node's volumesAttached and volumesInUse the way the
// attach/detach controller and the kubelet would.
func (f *fixture) nodeVolumes(node string, pv *v1.PersistentVolume, attached, inUse bool) {
	f.t.Helper()
	u := kubenames.UniqueVolumeName(f.driver, pv.Spec.CSI.VolumeHandle)
	status := map[string]any{"volumesAttached": []v1.AttachedVolume{}, "volumesInUse": []v1.UniqueVolumeName{}}
	if attached {
		status["volumesAttached"] = []v1.AttachedVolume{{Name: u}}
	}
	if inUse {
		status["volumesInUse"] = []v1.UniqueVolumeName{u}
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	if _, err := f.client.CoreV1().Nodes().Patch(f.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		f.t.Fatal(err)
	}
}

// lease creates the attacher's leader election Lease in namespace.
func (f *fixture) lease(namespace string, renewedAgo time.Duration) {
	f.t.Helper()
	holder, secs := "csi-attacher-0", int32(15)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: kube.LeaseName(f.driver)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
			RenewTime: &metav1.MicroTime{Time: time.Now().Add(-renewedAgo)}},
	}
	if _, err := f.client.CoordinationV1().Leases(namespace).Create(f.ctx, l, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// latchctl runs the command as the binary would, against the cluster.
func (f *fixture) latchctl(args ...string) (stdout string, code int) {
	f.t.Helper()
	var out, errOut bytes.Buffer
	code = run(f.ctx, "latchctl", append([]string{"--kubeconfig", f.kubeconfig}, args...), &out, &errOut, time.Now)
	f.t.Logf("latchctl %s → exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), code
}

// mustSay fails unless out contains every string.
func mustSay(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

// line returns the output line starting with status that mentions all of
// want, or "".
func line(out, status string, want ...string) string {
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, status) {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			return l
		}
	}
	return ""
}

func mustLine(t *testing.T, out, status string, want ...string) {
	t.Helper()
	if line(out, status, want...) == "" {
		t.Errorf("no %s line mentioning %q", status, want)
	}
}

type bytesBuffer = bytes.Buffer

func resourceOneGi() resource.Quantity { return resource.MustParse("1Gi") }
