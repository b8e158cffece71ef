package attacher_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// rawCodec passes gRPC messages through as bytes (*[]byte).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// secretsSeen is what a csiSecretsProxy saw: per volume ID, the secrets
// of every ControllerPublish and ControllerUnpublish request in order.
type secretsSeen struct {
	mu                 sync.Mutex
	publish, unpublish map[string][]map[string]string
}

func (s *secretsSeen) record(method string, req []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch method {
	case "/csi.v1.Controller/ControllerPublishVolume":
		var r csipb.ControllerPublishVolumeRequest
		if err := proto.Unmarshal(req, &r); err != nil {
			return err
		}
		s.publish[r.GetVolumeId()] = append(s.publish[r.GetVolumeId()], maps.Clone(r.GetSecrets()))
	case "/csi.v1.Controller/ControllerUnpublishVolume":
		var r csipb.ControllerUnpublishVolumeRequest
		if err := proto.Unmarshal(req, &r); err != nil {
			return err
		}
		s.unpublish[r.GetVolumeId()] = append(s.unpublish[r.GetVolumeId()], maps.Clone(r.GetSecrets()))
	}
	return nil
}

// of returns the secrets of the publishes and unpublishes of volume.
func (s *secretsSeen) of(volume string) (publish, unpublish []map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.publish[volume]), slices.Clone(s.unpublish[volume])
}

// csiSecretsProxy serves a unix socket that forwards every call to the
// test's mock driver and records the secrets csi-attacher sends (the mock
// driver keeps none). It returns the socket to give csi-attacher.
func csiSecretsProxy(t *testing.T, e *env) (string, *secretsSeen) {
	t.Helper()
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "csiproxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	seen := &secretsSeen{publish: map[string][]map[string]string{}, unpublish: map[string][]map[string]string{}}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		var req, resp []byte
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		if err := seen.record(method, req); err != nil {
			t.Errorf("decode %s request: %v", method, err)
		}
		if err := conn.Invoke(stream.Context(), method, &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
			return err
		}
		return stream.SendMsg(&resp)
	}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		_ = conn.Close()
	})
	return socket, seen
}

// upstream: TestCSIHandler "VolumeAttachment with empty secrets ->
// successful attachment", "… with InlineVolumeSpec and empty secrets ->
// successful attachment", "volume with empty secrets -> successful
// detach", "volume attachment with InlineVolumeSpec and empty secrets ->
// successful detach". A controller-publish Secret that exists but holds
// no data is no error: ControllerPublish and ControllerUnpublish are
// called with no secrets, for a PV and for an inline volume. A PV whose
// Secret has data, beside them, gets that data on both calls (the proxy
// does see secrets).
func TestEmptySecretIsPublishedAndUnpublishedWithNoSecrets(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	socket, seen := csiSecretsProxy(t, e)
	e.socket = socket
	e.stopAtt = e.startAttacher(envOptions{}, "")

	emptySecret, fullSecret := e.prefix+"-empty", e.prefix+"-full"
	emptyPV, fullPV, inlineHandle := e.prefix+"-pv-empty", e.prefix+"-pv-full", e.prefix+"-inline"
	e.createPVWithSecret(emptyPV, emptySecret, nil)
	e.createPVWithSecret(fullPV, fullSecret, map[string]string{"user": "u1", "password": "p1"})
	inline := e.newVA(e.prefix+"-va-inline", "", e.node)
	inline.Spec.Source = storagev1.VolumeAttachmentSource{InlineVolumeSpec: &v1.PersistentVolumeSpec{
		AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
			Driver: e.name, VolumeHandle: inlineHandle,
			ControllerPublishSecretRef: &v1.SecretReference{Namespace: "default", Name: emptySecret},
		}},
	}}
	vas := map[string]string{ // volume ID → VolumeAttachment
		emptyPV: e.prefix + "-va-empty", fullPV: e.prefix + "-va-full", inlineHandle: inline.Name,
	}
	e.createVA(e.newVA(vas[emptyPV], emptyPV, e.node))
	e.createVA(e.newVA(vas[fullPV], fullPV, e.node))
	e.createVA(inline)
	wantRef := map[string]string{emptyPV: emptySecret, fullPV: fullSecret, inlineHandle: emptySecret}
	for vol, va := range vas {
		got := e.waitAttached(va, 30*time.Second)
		if got.Status.AttachError != nil {
			t.Errorf("%s: attachError %q", va, got.Status.AttachError.Message)
		}
		if ref := got.Annotations[attacher.AnnSecretRef]; ref != "default/"+wantRef[vol] {
			t.Errorf("%s: secret reference annotation %q, want default/%s", va, ref, wantRef[vol])
		}
	}
	for _, va := range vas {
		e.deleteVA(va)
	}
	for _, va := range vas {
		e.waitGone(va)
	}

	want := map[string]map[string]string{
		emptyPV: {}, inlineHandle: {}, fullPV: {"user": "u1", "password": "p1"},
	}
	for vol, wantSecrets := range want {
		publish, unpublish := seen.of(vol)
		if len(publish) != 1 || len(unpublish) != 1 {
			t.Errorf("%s: %d publishes and %d unpublishes seen, want one each", vol, len(publish), len(unpublish))
			continue
		}
		if !maps.Equal(publish[0], wantSecrets) {
			t.Errorf("%s: ControllerPublish secrets have keys %v, want %v", vol, slices.Sorted(maps.Keys(publish[0])), slices.Sorted(maps.Keys(wantSecrets)))
		}
		if !maps.Equal(unpublish[0], wantSecrets) {
			t.Errorf("%s: ControllerUnpublish secrets have keys %v, want %v", vol, slices.Sorted(maps.Keys(unpublish[0])), slices.Sorted(maps.Keys(wantSecrets)))
		}
		if got := e.driver.Published(vol); len(got) != 0 {
			t.Errorf("%s still published to %v", vol, got)
		}
	}
}

// upstream: TestCSIHandler "volume with missing secrets -> error" (detach).
// The Secret of an attached PV is deleted, then its VolumeAttachment: the
// detach records detachError naming the Secret (upstream: `failed to load
// secret "ns/name": …not found`), shows a DetachFailed event, keeps the
// finalizer and calls no ControllerUnpublish; it is retried (latch looks
// for the Secret again every SecretRetryInterval, Secrets are not
// watched) and completes once the Secret is back.
func TestDetachWithMissingSecretIsReportedThenDetachesWhenCreated(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName, secret := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-secret"
	e.createPVWithSecret(pv, secret, map[string]string{"password": "p1"})
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttached(vaName, 30*time.Second)
	if err := e.client.CoreV1().Secrets("default").Delete(e.ctx, secret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	e.deleteVA(vaName)
	want := fmt.Sprintf("secret default/%s not found", secret)
	var va *storagev1.VolumeAttachment
	e.eventually(30*time.Second, "detachError naming the missing secret", func() (bool, error) {
		va = e.getVA(vaName)
		return va.Status.DetachError != nil && strings.Contains(va.Status.DetachError.Message, want), nil
	})
	if msg := e.eventMessage(vaName, "DetachFailed"); !strings.Contains(msg, want) {
		t.Errorf("DetachFailed event %q does not say %q", msg, want)
	}
	// A while later (the Secret looked for every 500 ms meanwhile): still
	// blocked, nothing unpublished.
	time.Sleep(2 * time.Second)
	va = e.getVA(vaName)
	if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) {
		t.Errorf("finalizers %v lost ours while the volume is still published", va.Finalizers)
	}
	if n := len(e.driver.CallsTo(unpublishMethod)); n != 0 {
		t.Errorf("ControllerUnpublish called %d times without the Secret", n)
	}
	if got := e.driver.Published(pv); !slices.Contains(got, e.nodeID) {
		t.Errorf("volume published to %v, want still %s", got, e.nodeID)
	}

	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: secret}, StringData: map[string]string{"password": "p1"}}
	if _, err := e.client.CoreV1().Secrets("default").Create(context.WithoutCancel(e.ctx), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitGone(vaName)
	if n := len(e.driver.CallsTo(unpublishMethod)); n != 1 {
		t.Errorf("ControllerUnpublish calls = %d, want 1", n)
	}
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Errorf("volume still published to %v", got)
	}
}
