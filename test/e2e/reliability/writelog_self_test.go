package reliability_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/testsupport"
)

// Invariant 6's checker must be able to fail: of the writes a server
// refuses, it keeps a validation failure (422 "is invalid") and a 403,
// and passes over a guarded JSON patch that could not apply (422 "test
// failed", or the generic message without field errors), a 409 and a
// 404.
func TestWriteLog_keepsOnlyWritesRefusedAsInvalid(t *testing.T) {
	answers := map[string]struct {
		code    int
		message string
	}{
		"invalid":    {http.StatusUnprocessableEntity, `VolumeAttachment.storage.k8s.io "invalid" is invalid: status.attachError.message: Too long`},
		"testfailed": {http.StatusUnprocessableEntity, "the server rejected our request due to an error in our request: test failed"},
		"generic":    {http.StatusUnprocessableEntity, "the server rejected our request due to an error in our request"},
		"forbidden":  {http.StatusForbidden, `volumeattachments "forbidden" is forbidden`},
		"conflict":   {http.StatusConflict, "the object has been modified"},
		"notfound":   {http.StatusNotFound, "not found"},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		a := answers[name]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":%q,"code":%d}`, a.message, a.code)
	}))
	defer srv.Close()
	api := testsupport.NewAPITransport()
	cfg := &rest.Config{Host: srv.URL}
	cfg.Wrap(api.Wrap)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name := range answers {
		_, _ = client.StorageV1().VolumeAttachments().Patch(context.Background(), name, types.JSONPatchType, []byte(`[]`), metav1.PatchOptions{})
	}
	var l writeLog
	l.add("csi-attacher", api)
	total, problems := l.problems(10)
	got := strings.Join(problems, "\n")
	if total != 2 || !strings.Contains(got, "/invalid") || !strings.Contains(got, "/forbidden") || !strings.Contains(got, "csi-attacher PATCH") {
		t.Errorf("writeLog kept %d writes:\n%s\nwant the 422 'is invalid' and the 403, named by component", total, got)
	}
}
