package reliability_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport"
)

// startBinary runs bin with args, its stdout and stderr in one buffer,
// until the returned stop (also run at cleanup) sends SIGTERM and waits.
func startBinary(t *testing.T, bin string, args ...string) (*testsupport.SyncBuffer, func()) {
	t.Helper()
	out := &testsupport.SyncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := sync.OnceFunc(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s did not exit within 30s of SIGTERM", filepath.Base(bin))
		}
	})
	t.Cleanup(stop)
	return out, stop
}

// kubeconfigFile writes the package's cluster's kubeconfig into a
// temporary directory of t and returns its path.
func kubeconfigFile(t *testing.T) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// attachWithAFailure attaches two new volumes, a and b, to node n through
// Pods pa and pb. b's first ControllerPublish fails (PermissionDenied,
// "credentials rejected"), so the error path, which logs the request,
// runs too.
func (e *env) attachWithAFailure(n string) (a, b string) {
	e.t.Helper()
	a, b = e.volume("a"), e.volume("b")
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: b, Times: 1, Code: codes.PermissionDenied, Message: "credentials rejected"})
	e.pod("pa", n, a)
	e.pod("pb", n, b)
	e.waitAttached(a, n)
	e.waitAttached(b, n)
	return a, b
}

// jsonType is the JSON type of a decoded value as a log pipeline types a
// field ("" for null, which fits any type).
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return ""
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// keyTypes records, for every key path (nested object keys joined with
// "."), each JSON type seen and one line that shows it.
type keyTypes map[string]map[string]string

func (k keyTypes) add(prefix string, obj map[string]any, line string) {
	for key, v := range obj {
		path := prefix + key
		typ := jsonType(v)
		if typ == "" {
			continue
		}
		if k[path] == nil {
			k[path] = map[string]string{}
		}
		if _, ok := k[path][typ]; !ok {
			k[path][typ] = line
		}
		if m, ok := v.(map[string]any); ok {
			k.add(path+".", m, line)
		}
	}
}

// parseJSONLog decodes every line of out (the output of a binary run
// with --logging-format=json) and adds its keys to types. It returns the
// decoded lines and the lines that are not JSON objects.
func parseJSONLog(out, who string, types keyTypes) (lines []map[string]any, bad []string) {
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(text), &obj); err != nil {
			bad = append(bad, fmt.Sprintf("%s: %.300s", who, text))
			continue
		}
		lines = append(lines, obj)
		types.add("", obj, fmt.Sprintf("%s: %.400s", who, text))
	}
	return lines, bad
}

// Both binaries with --logging-format=json at -v=5 through attaches, a
// failed publish, a volume moved between nodes and detaches: every line
// is JSON, no key (nested keys included) has two JSON types across the
// two binaries (log pipelines type a field from its first value), each
// CSI call is logged once (not again by csi-lib-utils' interceptor), and
// no byte run of the controller-publish secret shows.
func TestJSONLogsOneTypePerKeyAndOneLinePerCSICall_bothBinariesAtVerbosity5(t *testing.T) {
	attacherBin, err := csiAttacherBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctrlBin, err := testsupport.Binary("cmd/attachdetach-controller")
	if err != nil {
		t.Fatal(err)
	}
	secret := map[string][]byte{
		"username": []byte("svc-json-5c3e71"),
		"password": []byte("pw-Lk2#pQ77-xV9n"),
	}
	e := newEnv(t, options{secret: secret, noAttacher: true, noController: true})
	common := []string{"--kubeconfig=" + kubeconfigFile(t), "--logging-format=json", "-v=5"}
	attOut, stopAtt := startBinary(t, attacherBin, append([]string{
		"--csi-address=" + e.socket, "--timeout=10s", "--retry-interval-start=100ms",
		"--retry-interval-max=1s", "--reconcile-sync=0",
	}, common...)...)
	ctrlOut, stopCtrl := startBinary(t, ctrlBin, append([]string{
		"--leader-elect=false", "--http-endpoint=", "--reconcile-sync=0",
	}, common...)...)

	n1, n2 := e.addNode("n1"), e.addNode("n2")
	a, b := e.attachWithAFailure(n1)
	// a moves: detached from n1 before it is attached to n2.
	e.deletePod("pa")
	e.pod("qa", n2, a)
	e.waitAttached(a, n2)
	e.waitGone(a, n1)
	e.deletePod("qa")
	e.deletePod("pb")
	e.waitGone(a, n2)
	e.waitGone(b, n1)
	stopCtrl()
	stopAtt()

	types := keyTypes{}
	attLines, bad := parseJSONLog(attOut.String(), "csi-attacher", types)
	ctrlLines, badCtrl := parseJSONLog(ctrlOut.String(), "attachdetach-controller", types)
	for _, l := range append(bad, badCtrl...) {
		t.Errorf("a line is not a JSON object: %s", l)
	}
	// The capture must be what the test needs: both binaries at -v=5,
	// the failed publish and node keys in both.
	for _, want := range []struct{ who, out, s string }{
		{"csi-attacher", attOut.String(), "ControllerPublishVolume"},
		{"csi-attacher", attOut.String(), "credentials rejected"},
		{"csi-attacher", attOut.String(), `"node":`},
		{"attachdetach-controller", ctrlOut.String(), "Created VolumeAttachment"},
		{"attachdetach-controller", ctrlOut.String(), `"node":`},
		{"attachdetach-controller", ctrlOut.String(), `"v":5`},
	} {
		if !strings.Contains(want.out, want.s) {
			t.Errorf("%s's output (%d bytes) does not contain %s: the capture is not what the test needs", want.who, len(want.out), want.s)
		}
	}

	keys := make([]string, 0, len(types))
	for k := range types {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if len(types[k]) < 2 {
			continue
		}
		var ex []string
		for typ, line := range types[k] {
			ex = append(ex, fmt.Sprintf("  as %s in %s", typ, line))
		}
		sort.Strings(ex)
		t.Errorf("log key %q has %d JSON types:\n%s", k, len(types[k]), strings.Join(ex, "\n"))
	}

	// One request line per CSI call: the driver's count of calls for a
	// volume against the log lines that carry that call's request.
	for _, method := range []string{"ControllerPublishVolume", "ControllerUnpublishVolume"} {
		for _, vol := range []string{a, b} {
			ok, failed := e.callsFor(method, vol)
			logged := 0
			for _, l := range attLines {
				m, _ := l["method"].(string)
				req, _ := l["request"].(string)
				if strings.HasSuffix(m, method) && strings.Contains(req, fmt.Sprintf("%q", vol)) {
					logged++
				}
			}
			if ok+failed == 0 || logged != ok+failed {
				t.Errorf("%s of %s: the driver got %d calls, csi-attacher logged %d requests (want one line per call)", method, vol, ok+failed, logged)
			}
		}
	}

	for _, out := range []string{attOut.String(), ctrlOut.String()} {
		for _, leak := range secretLeaks(out, secret) {
			t.Errorf("a secret value appears in the logs at -v=5: %s", leak)
		}
	}
	t.Logf("checked %d JSON lines of csi-attacher and %d of attachdetach-controller, %d keys", len(attLines), len(ctrlLines), len(keys))
}
