package latchlocal

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/latchcsi/latch/internal/stack"
)

// controlEnv is an upstream-mode Env with nothing running, serving
// latch-local's commands on client until the test ends.
func controlEnv(t *testing.T, client kubernetes.Interface) *Env {
	t.Helper()
	e := &Env{Client: client, up: &upstreamState{}}
	ctx, cancel := context.WithCancel(t.Context())
	if err := e.serveControl(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-e.controlDone })
	return e
}

func controlConfigMap(t *testing.T, client kubernetes.Interface) *v1.ConfigMap {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(ControlNamespace).Get(t.Context(), ControlConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// A command goes through the ConfigMap to the running latch-local and its
// reply comes back: an error as the command's error, naming the
// component and the cause; the ConfigMap lists what runs.
func TestControlCarriesACommandToLatchLocalAndItsReplyBack(t *testing.T) {
	client := fake.NewClientset()
	e := controlEnv(t, client)
	if got, want := controlConfigMap(t, client).Data[controlComponentsKey], "external-attacher: stopped\ncsi-attacher: stopped\nkube-controller-manager: stopped\nattachdetach-controller: stopped\n"; got != want {
		t.Errorf("components: %q, want %q", got, want)
	}
	for _, tc := range []struct {
		command []string
		want    string
	}{
		{[]string{"stop", CSIAttacher}, "csi-attacher: not running"},
		{[]string{"start", "bogus"}, `unknown command "start bogus"`},
		{[]string{"start", CSIAttacher, "--worker-threads=3"}, "start csi-attacher takes no flags"},
		{[]string{"restart", KubeControllerManager, "--foo"}, `restart takes --controllers=LIST only, got "--foo"`},
	} {
		var out bytes.Buffer
		if err := Control(t.Context(), client, tc.command, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("latch-local %s: %v, want an error with %q", strings.Join(tc.command, " "), err, tc.want)
		}
	}
	// kube-controller-manager running its attach/detach controller:
	// latch's is refused.
	e.mu.Lock()
	e.up.kcm, e.up.kcmControllers = &stack.Upstream{}, UpstreamControllers
	e.mu.Unlock()
	var out bytes.Buffer
	if err := Control(t.Context(), client, []string{"start", AttachDetachController}, &out); err == nil || !strings.Contains(err.Error(), "never run both") {
		t.Errorf("latch-local start attachdetach-controller beside kube-controller-manager --controllers=*: %v, want it refused", err)
	}
}

// A ConfigMap an earlier latch-local left (--data-dir) with a request
// still pending: the new latch-local does not carry it out but answers it
// with an error, and lists what runs now.
func TestControlAnswersARequestAnEarlierLatchLocalLeftPendingWithoutCarryingItOut(t *testing.T) {
	req, err := json.Marshal(controlRequest{ID: "earlier", Command: []string{"start", CSIAttacher}})
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ControlNamespace, Name: ControlConfigMap},
		Data:       map[string]string{controlRequestKey: string(req), controlComponentsKey: "csi-attacher: running\n"},
	})
	controlEnv(t, client)
	cm := controlConfigMap(t, client)
	_, reply, err := decodeControl(cm)
	if err != nil {
		t.Fatal(err)
	}
	if reply.ID != "earlier" || !strings.Contains(reply.Error, "not carried out") {
		t.Errorf("reply to the earlier request: %+v, want an error saying it was not carried out", reply)
	}
	if got := cm.Data[controlComponentsKey]; !strings.Contains(got, "csi-attacher: stopped") {
		t.Errorf("components: %q, want what runs now", got)
	}
	// The next command is served, and finds csi-attacher not started.
	var out bytes.Buffer
	if err := Control(t.Context(), client, []string{"stop", CSIAttacher}, &out); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("latch-local stop csi-attacher: %v, want csi-attacher: not running", err)
	}
}
