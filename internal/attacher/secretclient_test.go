package attacher

import (
	"bytes"
	"context"
	"encoding/hex"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
)

// globalKlogAtV10 sends klog's global logger, at -v=10 and with
// contextual logging off (--feature-gates=ContextualLogging=false), to a
// buffer until the test ends.
func globalKlogAtV10(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"v": "10", "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(&buf)
	klog.EnableContextualLogging(false)
	t.Cleanup(func() {
		klog.EnableContextualLogging(true)
		klog.Flush()
		_ = fs.Set("v", "0")
		_ = fs.Set("logtostderr", "true")
		_ = fs.Set("stderrthreshold", "ERROR")
		klog.SetOutput(os.Stderr)
	})
	return &buf
}

// The guard must not depend on the logger a context carries: with
// contextual logging off, client-go's Get dumps the Secret's protobuf into
// the global log at -v=8 and above, getSecret does not.
func TestGetSecret_dataNeverLoggedWithContextualLoggingOffAtV10(t *testing.T) {
	password := []byte("pw-Qx7!vT93-kL0z")
	secret := &v1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "publish"},
		Data:       map[string][]byte{"password": password},
	}
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	body, err := runtime.Encode(scheme.Codecs.EncoderForVersion(info.Serializer, v1.SchemeGroupVersion), secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/ns/secrets/publish" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	logs := globalKlogAtV10(t)
	client := kubernetes.NewForConfigOrDie(app.ComponentConfig(&rest.Config{Host: srv.URL}, "secret-test"))
	leaked := func() bool {
		klog.Flush()
		out := strings.ToLower(logs.String())
		// The hex dump's ASCII column holds the bytes as text; its hex
		// columns are searched for two runs of 4 (a dump line may split
		// the value anywhere).
		return strings.Contains(out, strings.ToLower(string(password[3:11]))) ||
			strings.Contains(out, hex.EncodeToString(password[3:11])) ||
			strings.Contains(out, "70 77 2d 51") || strings.Contains(out, "2d 6b 4c 30")
	}

	got, err := getSecret(context.Background(), client, "ns", "publish")
	if err != nil {
		t.Fatalf("getSecret: %v", err)
	}
	if !bytes.Equal(got.Data["password"], password) {
		t.Errorf("getSecret data = %q, want %q", got.Data["password"], password)
	}
	klog.Flush()
	if !strings.Contains(logs.String(), "/api/v1/namespaces/ns/secrets/publish") {
		t.Fatalf("the global log at -v=10 does not show the request; the capture is not what the test needs:\n%s", logs.String())
	}
	if leaked() {
		t.Errorf("getSecret: the secret appears in the log:\n%s", logs.String())
	}

	// The control: client-go's own Get does leak here, so the check above
	// can fail.
	if _, err := client.CoreV1().Secrets("ns").Get(context.Background(), "publish", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if !leaked() {
		t.Errorf("client-go's Get did not log the secret at -v=10 with contextual logging off: the test no longer checks anything\n%s", logs.String())
	}
}
