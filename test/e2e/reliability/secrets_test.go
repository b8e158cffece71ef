package reliability_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/latchcsi/latch/internal/csimock"
)

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// verbose10 sends every log line of the process (klog's global logger,
// which client-go and the API server use, at -v=10) and the controllers'
// contextual logger (also at -v=10) to one buffer, until the test ends.
func verbose10(t *testing.T) (*syncBuffer, klog.Logger) {
	buf := &syncBuffer{}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"v": "10", "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(buf)
	t.Cleanup(func() {
		klog.Flush()
		_ = fs.Set("v", "0")
		_ = fs.Set("logtostderr", "true")
		_ = fs.Set("stderrthreshold", "ERROR")
		klog.SetOutput(os.Stderr)
	})
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(10), textlogger.Output(buf)))
	return buf, logger
}

func TestControllerPublishSecretsNeverInLogsEventsOrStatus_bothControllersAtVerbosity10(t *testing.T) {
	secret := map[string][]byte{
		"username": []byte("svc-admin-4f1d9c"),
		"password": []byte("pw-Qx7!vT93-kL0z"),
	}
	logs, logger := verbose10(t)
	e := newEnv(t, options{secret: secret, logger: &logger})
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	var pvs []string
	for i := range 4 {
		pvs = append(pvs, e.volume(fmt.Sprintf("v%d", i)))
	}
	// Errors that end up in status, events and logs, a crash and a move:
	// every path that could print a request.
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pvs[0], Times: 2, Code: codes.PermissionDenied, Message: "credentials rejected"})
	e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pvs[1], Times: 2, Code: codes.Unavailable, Message: "backend busy"})
	for i, pv := range pvs {
		e.pod(fmt.Sprintf("p%d", i), n1, pv)
	}
	for _, pv := range pvs {
		e.waitAttached(pv, n1)
	}
	e.crashDriver(true, 300*time.Millisecond)
	e.deletePod("p1")
	e.pod("q1", n2, pvs[1])
	e.waitAttached(pvs[1], n2)
	e.checkInvariants(30 * time.Second)
	// The VolumeAttachments at rest, status and annotations included.
	vaJSON, err := json.Marshal(e.vas())
	if err != nil {
		t.Fatal(err)
	}
	e.teardownClean()

	var secretForms []string
	for _, v := range secret {
		secretForms = append(secretForms, string(v), base64.StdEncoding.EncodeToString(v), fmt.Sprintf("%q", v))
	}
	klog.Flush()
	out := logs.String()
	// The capture must really be at -v=10 and cover both controllers and
	// the secret's use, or the test proves nothing.
	for _, want := range []string{"publish-secret", "ControllerPublishVolume", "Created VolumeAttachment", "credentials rejected"} {
		if !strings.Contains(out, want) {
			t.Errorf("captured logs (%d bytes) do not contain %q: the capture is not what the test needs", len(out), want)
		}
	}
	events, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defEvents, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var eventText strings.Builder
	for _, ev := range append(events.Items, defEvents.Items...) {
		eventText.WriteString(ev.Message + "\n" + ev.Reason + "\n")
	}
	for _, s := range secretForms {
		if i := strings.Index(out, s); i >= 0 {
			t.Errorf("a secret value appears in the logs: ...%s...", out[max(0, i-200):min(len(out), i+len(s)+50)])
		}
		if strings.Contains(eventText.String(), s) {
			t.Errorf("a secret value appears in an event")
		}
		if strings.Contains(string(vaJSON), s) {
			t.Errorf("a secret value appears in a VolumeAttachment")
		}
	}
	t.Logf("checked %d bytes of logs at -v=10 and %d events", len(out), len(events.Items)+len(defEvents.Items))
}
