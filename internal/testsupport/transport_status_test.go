package testsupport

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// A write the server refuses is recorded with the Reason and Message of
// its answer, in JSON or protobuf, and the answer's bytes; the client
// still reads the whole answer (the same error as without the
// transport).
func TestAPITransportRecordsTheStatusOfARefusedWrite(t *testing.T) {
	const msg = `VolumeAttachment.storage.k8s.io "va" is invalid: status.attachError.message: Too long`
	status := &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Reason: metav1.StatusReasonInvalid, Code: http.StatusUnprocessableEntity, Message: msg,
	}
	for _, mediaType := range []string{runtime.ContentTypeJSON, runtime.ContentTypeProtobuf} {
		t.Run(mediaType, func(t *testing.T) {
			info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), mediaType)
			if !ok {
				t.Fatalf("no serializer for %s", mediaType)
			}
			body, err := runtime.Encode(scheme.Codecs.EncoderForVersion(info.Serializer, schema.GroupVersion{Version: "v1"}), status)
			if err != nil {
				t.Fatal(err)
			}
			s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", mediaType)
				w.WriteHeader(http.StatusUnprocessableEntity)
				_, _ = w.Write(body)
			}))
			defer s.Close()
			tr := NewAPITransport()
			c := clientSending(t, s, tr, mediaType)
			va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}}
			_, err = c.StorageV1().VolumeAttachments().UpdateStatus(context.Background(), va, metav1.UpdateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Too long") {
				t.Errorf("client got %v, want the server's Invalid answer", err)
			}
			w := tr.Writes()
			if len(w) != 1 {
				t.Fatalf("writes = %+v, want 1", w)
			}
			if w[0].Code != http.StatusUnprocessableEntity || w[0].Reason != metav1.StatusReasonInvalid || w[0].Message != msg ||
				string(w[0].Body) != string(body) || w[0].At.IsZero() || w[0].Injected {
				t.Errorf("write = %+v, want the 422 with reason Invalid, message %q, the body and the time", w[0], msg)
			}
		})
	}
}

// An injected failure is recorded with the Status the transport sent.
func TestAPITransportRecordsTheStatusOfAnInjectedFailure(t *testing.T) {
	s, _ := server(t)
	tr := NewAPITransport()
	c := client(t, s, tr)
	tr.FailNth(Match{Method: "patch", Resource: "volumeattachments"}, 1, http.StatusForbidden, "no")
	_, err := c.StorageV1().VolumeAttachments().Patch(context.Background(), "va", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("patch: %v, want Forbidden", err)
	}
	if w := tr.Writes(); len(w) != 1 || w[0].Reason != metav1.StatusReasonForbidden || w[0].Message != "no" || !w[0].Injected {
		t.Errorf("writes = %+v, want one injected Forbidden with message no", w)
	}
}
