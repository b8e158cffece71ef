package attacher_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

func TestMetricsEndpointServesCSIWorkqueueAndLatchMetricsAfterAttachAndError(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	addr := testsupport.FreeAddr(t)
	e.startBinary("metrics", "--http-endpoint="+addr)
	pv1, va1, pv2, va2 := e.prefix+"-pv1", e.prefix+"-va1", e.prefix+"-pv2", e.prefix+"-va2"
	e.createPV(pv1)
	e.createPV(pv2)
	if _, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, VolumeID: pv2, Once: true, Code: codes.Internal, Message: "controller busy"}); err != nil {
		t.Fatal(err)
	}
	e.createVA(e.newVA(va1, pv1, e.node))
	e.createVA(e.newVA(va2, pv2, e.node))
	e.waitAttached(va1, time.Minute)
	e.waitAttached(va2, time.Minute)

	publish := "/csi.v1.Controller/ControllerPublishVolume"
	wantSamples := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		// csi-lib-utils' histogram, with upstream's labels.
		{"csi_sidecar_operations_seconds_count", map[string]string{"driver_name": e.name, "method_name": publish, "grpc_status_code": "OK"}, 2},
		{"csi_sidecar_operations_seconds_count", map[string]string{"driver_name": e.name, "method_name": publish, "grpc_status_code": "Internal"}, 1},
		// latch's own.
		{"latch_attacher_attach_latency_seconds_count", nil, 2},
		{"latch_attacher_csi_errors_total", map[string]string{"operation": "attach", "code": "Internal"}, 1},
	}
	// The attach latency is recorded when the status write returns, which
	// can be a moment after the test's watch saw the VA attached: scrape
	// until the figures are there (or stop changing), then check them.
	var samples testsupport.Samples
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		samples = scrape(t, "http://"+addr+"/metrics")
		all := true
		for _, c := range wantSamples {
			if got, ok := samples.Value(c.name, c.labels); !ok || got != c.want {
				all = false
			}
		}
		if all || time.Now().After(deadline) {
			break
		}
	}
	for _, c := range wantSamples {
		if got, ok := samples.Value(c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := samples.Value("csi_sidecar_operations_seconds_count", map[string]string{"method_name": "/csi.v1.Identity/GetPluginInfo"}); !ok {
		t.Errorf("no csi_sidecar_operations_seconds for GetPluginInfo")
	}
	// As external-attacher: the migrated label only for the CSI driver of a
	// migrated in-tree plugin, which this one is not.
	for _, s := range samples.Find("csi_sidecar_operations_seconds_count", nil) {
		if _, ok := s.Labels["migrated"]; ok {
			t.Errorf("csi_sidecar_operations_seconds_count%v has a migrated label; upstream has none for a driver that is not a migration target", s.Labels)
		}
	}
	if got, _ := samples.Value("workqueue_adds_total", map[string]string{"name": "csi-attacher-va"}); got < 2 {
		t.Errorf("workqueue_adds_total{name=csi-attacher-va} = %v, want at least 2", got)
	}
	for _, q := range []string{"csi-attacher-va", "csi-attacher-va-detach", "csi-attacher-pv"} {
		for _, name := range []string{"workqueue_depth", "latch_workqueue_oldest_item_age_seconds"} {
			if _, ok := samples.Value(name, map[string]string{"name": q}); !ok {
				t.Errorf("%s{name=%q} missing", name, q)
			}
		}
	}
	if got, _ := samples.Value("workqueue_retries_total", map[string]string{"name": "csi-attacher-va"}); got < 1 {
		t.Errorf("workqueue_retries_total{name=csi-attacher-va} = %v, want the failed publish's retry", got)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %v %v", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

func TestSecretsNeverAppearInLogsEventsOrStatusAtVerbosity10(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	pv, vaName, secretName := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-secret"
	// Random values: any 8 characters of them found anywhere are a leak,
	// even when a hex dump splits the value across lines.
	secretValues := []string{randomHex(t, 16), randomHex(t, 16)}
	secret := &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: secretName},
		StringData: map[string]string{"password": secretValues[0], "token": secretValues[1]},
	}
	if _, err := e.client.CoreV1().Secrets("default").Create(e.ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createPV(pv, func(s *localcluster.VolumeSpec) {
		s.SecretRef = &v1.SecretReference{Namespace: "default", Name: secretName}
	})
	// Failed publishes and unpublishes put errors into status, events and
	// the error logs too; each fault stays until the test has seen its
	// error.
	att := e.startBinary("verbose", "-v=10")
	var vaJSON []byte
	snapshot := func() {
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(va)
		vaJSON = append(vaJSON, b...)
	}
	fault, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, VolumeID: pv, Code: codes.PermissionDenied, Message: "credentials rejected"})
	if err != nil {
		t.Fatal(err)
	}
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, "credentials rejected")
	snapshot()
	e.driver.RemoveFault(fault)
	e.waitAttached(vaName, time.Minute)
	snapshot()

	if fault, err = e.driver.AddFault(csimock.Rule{Method: unpublishMethod, VolumeID: pv, Code: codes.PermissionDenied, Message: "credentials rejected on detach"}); err != nil {
		t.Fatal(err)
	}
	e.deleteVA(vaName)
	e.eventually(30*time.Second, "detachError recorded", func() (bool, error) {
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{})
		return err == nil && va.Status.DetachError != nil, nil
	})
	snapshot()
	e.driver.RemoveFault(fault)
	e.waitGone(vaName)
	att.signal(syscall.SIGTERM)
	if code := att.exitCode(time.Minute); code != 0 {
		t.Fatalf("csi-attacher exited with %d", code)
	}
	events, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + vaName})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) == 0 {
		t.Fatalf("no events recorded for %s; the test needs them to mean anything", vaName)
	}
	eventsJSON, _ := json.Marshal(events)

	logs := att.out.String()
	// The logs are really that verbose: CSI requests and API response
	// bodies are in them.
	for _, want := range []string{"ControllerPublishVolume", "ControllerUnpublishVolume", "Response Body", "credentials rejected"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs at -v=10 do not contain %q; the test would prove nothing", want)
		}
	}
	if got := e.driver.Stats().Methods[publishMethod].ByCode["OK"]; got != 1 {
		t.Errorf("successful publish calls = %d, want 1", got)
	}
	for _, secretValue := range secretValues {
		forms := []string{base64.StdEncoding.EncodeToString([]byte(secretValue))}
		for i := 0; i+8 <= len(secretValue); i++ {
			forms = append(forms, secretValue[i:i+8])
		}
		for _, form := range forms {
			for what, text := range map[string]string{"logs": logs, "VolumeAttachment": string(vaJSON), "events": string(eventsJSON)} {
				if i := strings.Index(text, form); i >= 0 {
					t.Errorf("secret value %q: %q found in %s: ...%s...", secretValue, form, what, text[max(0, i-300):min(len(text), i+100)])
				}
			}
		}
	}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func TestMigratedInTreeGCEPDIsTranslatedPublishedAndLabelledMigrated(t *testing.T) {
	const gcePD = "pd.csi.storage.gke.io"
	e := newEnv(t, envOptions{noAttacher: true, driverName: gcePD})
	addr := testsupport.FreeAddr(t)
	e.startBinary("migration", "--http-endpoint="+addr)
	pvName, vaName, disk := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-disk"
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Labels: map[string]string{v1.LabelTopologyZone: "europe-west1-b"}},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
			PersistentVolumeSource: v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{
				PDName: disk, FSType: "xfs",
			}},
		},
	}
	if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The attach/detach controller names the CSI driver as attacher for a
	// migrated in-tree volume.
	e.createVA(e.newVA(vaName, pvName, e.node))
	va := e.waitAttached(vaName, time.Minute)

	handle := "projects/UNSPECIFIED/zones/europe-west1-b/disks/" + disk
	calls := e.driver.CallsTo(publishMethod)
	if len(calls) != 1 || calls[0].VolumeID != handle || calls[0].NodeID != e.nodeID {
		t.Fatalf("publish calls = %+v, want one for the translated handle %q", calls, handle)
	}
	var fsType string
	for _, vol := range e.driver.State().Volumes {
		if vol.ID == handle && len(vol.Published) == 1 {
			fsType = vol.Published[0].AccessType
		}
	}
	if fsType != "mount" {
		t.Errorf("published access type = %q, want mount", fsType)
	}
	if va.Annotations["attacher.latch.dev/volume-handle"] != handle {
		t.Errorf("volume-handle annotation = %q, want the translated handle", va.Annotations["attacher.latch.dev/volume-handle"])
	}
	got, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if count(got.Finalizers, kubenames.PVFinalizer(gcePD)) != 1 {
		t.Errorf("in-tree PV finalizers = %v, want %s once", got.Finalizers, kubenames.PVFinalizer(gcePD))
	}

	e.deleteVA(vaName)
	e.waitGone(vaName)
	if pubs := e.driver.Published(handle); len(pubs) != 0 {
		t.Errorf("translated volume still published to %v", pubs)
	}
	samples := scrape(t, "http://"+addr+"/metrics")
	for _, method := range []string{"/csi.v1.Controller/ControllerPublishVolume", "/csi.v1.Controller/ControllerUnpublishVolume"} {
		if n, _ := samples.Value("csi_sidecar_operations_seconds_count", map[string]string{"driver_name": gcePD, "method_name": method, "migrated": "true"}); n != 1 {
			t.Errorf("csi_sidecar_operations_seconds_count{%s, migrated=true} = %v, want 1", method, n)
		}
		if n, ok := samples.Value("csi_sidecar_operations_seconds_count", map[string]string{"driver_name": gcePD, "method_name": method, "migrated": "false"}); ok && n != 0 {
			t.Errorf("csi_sidecar_operations_seconds_count{%s, migrated=false} = %v, want none", method, n)
		}
	}
}
