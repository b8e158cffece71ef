package reliability_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport"
)

// verbose10 sends every log line of the process (klog's global logger,
// which client-go and the API server use, at -v=10) and the controllers'
// contextual logger (also at -v=10) to one buffer, until the test ends.
func verbose10(t *testing.T) (*testsupport.SyncBuffer, klog.Logger) {
	buf := &testsupport.SyncBuffer{}
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
	for _, leak := range secretLeaks(out, secret) {
		t.Errorf("a secret value appears in the logs: %s", leak)
	}
	for _, leak := range secretLeaks(eventText.String(), secret) {
		t.Errorf("a secret value appears in an event: %s", leak)
	}
	for _, leak := range secretLeaks(string(vaJSON), secret) {
		t.Errorf("a secret value appears in a VolumeAttachment: %s", leak)
	}
	t.Logf("checked %d bytes of logs at -v=10 and %d events", len(out), len(events.Items)+len(defEvents.Items))
}

// csiAttacherBinary builds cmd/csi-attacher once per test binary.
func csiAttacherBinary() (string, error) { return testsupport.Binary("cmd/csi-attacher") }

// The real csi-attacher binary at -v=10, in every logging mode it has:
// text and JSON, with contextual logging on (the default) and off. With
// it off client-go logs through the global logger, so a guard that only
// hands client-go a quieter contextual logger does not hold.
func TestControllerPublishSecretsNeverInCsiAttacherLogs_everyLoggingFormatAndContextualMode(t *testing.T) {
	bin, err := csiAttacherBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"text", []string{"--logging-format=text"}},
		{"text-ContextualLogging=false", []string{"--logging-format=text", "--feature-gates=ContextualLogging=false"}},
		{"json", []string{"--logging-format=json"}},
		{"json-ContextualLogging=false", []string{"--logging-format=json", "--feature-gates=ContextualLogging=false"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			secret := map[string][]byte{
				"username": []byte("svc-admin-" + mode.name[:4] + "-7e2b91"),
				"password": []byte("pw-Zr4?mW82-jH1y-" + mode.name[:4]),
			}
			e := newEnv(t, options{secret: secret, noAttacher: true})
			out, stop := startBinary(t, bin, append([]string{
				"--csi-address=" + e.socket, "--kubeconfig=" + kubeconfigFile(t), "-v=10",
				"--timeout=10s", "--retry-interval-start=100ms", "--retry-interval-max=1s", "--reconcile-sync=0",
			}, mode.args...)...)

			n1 := e.addNode("n1")
			// An attach that fails first (the error path logs the request)
			// and a detach after a success: both read the secret.
			a, b := e.attachWithAFailure(n1)
			e.deletePod("pa")
			e.waitGone(a, n1)
			e.deletePod("pb")
			e.waitGone(b, n1)
			stop()

			logs := out.String()
			// The capture must be at -v=10, in the format asked for, and
			// (where client-go logs through the global logger, which
			// nothing caps) include the Secret GET, or the test proves
			// nothing.
			wants := []string{"ControllerPublishVolume", "credentials rejected"}
			if strings.HasSuffix(mode.name, "ContextualLogging=false") {
				wants = append(wants, "/secrets/publish-secret")
			}
			for _, want := range wants {
				if !strings.Contains(logs, want) {
					t.Errorf("csi-attacher's output (%d bytes) does not contain %q: the capture is not what the test needs", len(logs), want)
				}
			}
			if strings.HasPrefix(mode.name, "json") != strings.HasPrefix(strings.TrimSpace(logs), "{") {
				t.Errorf("csi-attacher's output is not in the %s format: %.200s", mode.name, logs)
			}
			for _, leak := range secretLeaks(logs, secret) {
				t.Errorf("a secret value appears in csi-attacher's output: %s", leak)
			}
			t.Logf("checked %d bytes of csi-attacher output at -v=10 (%s)", len(logs), strings.Join(mode.args, " "))
		})
	}
}
