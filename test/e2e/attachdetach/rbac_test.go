package attachdetach_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
)

// applyDeployRBAC creates what deploy/attachdetach-controller/rbac.yaml
// declares and returns the ServiceAccount's namespace and name.
func applyDeployRBAC(t *testing.T, e *env) (string, string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "attachdetach-controller", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var saNS, saName string
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode rbac.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *v1.ServiceAccount:
			saNS, saName = o.Namespace, o.Name
			_, err = e.client.CoreV1().ServiceAccounts(o.Namespace).Create(e.ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = e.client.RbacV1().ClusterRoles().Create(e.ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = e.client.RbacV1().ClusterRoleBindings().Create(e.ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = e.client.RbacV1().Roles(o.Namespace).Create(e.ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = e.client.RbacV1().RoleBindings(o.Namespace).Create(e.ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected %T in rbac.yaml", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
	if saName == "" {
		t.Fatal("rbac.yaml declares no ServiceAccount")
	}
	return saNS, saName
}

// deniedRequests records requests the API server refused (401/403).
type deniedRequests struct {
	mu   sync.Mutex
	list []string
}

func (d *deniedRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil && (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized) {
			d.mu.Lock()
			d.list = append(d.list, fmt.Sprintf("%d %s %s", resp.StatusCode, req.Method, req.URL.Path))
			d.mu.Unlock()
		}
		return resp, err
	})
}

func (d *deniedRequests) get() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.list...)
}

// The controller runs as it is deployed: Serve, leader election on a
// Lease in kube-system, a ServiceAccount token bound only to deploy/'s
// RBAC. A Pod's volume goes through a failing attach (repeated Warning
// events, so the recorder both creates and patches events), a multi-attach
// conflict, attach, node status, detach; no request is refused.
func TestDeployRBAC_controllerNeedsNothingMore(t *testing.T) {
	e := newBareEnv(t, controller.Config{})
	drv := e.startMockDriverAndAttacher()
	saNS, saName := applyDeployRBAC(t, e)
	tok, err := e.client.CoreV1().ServiceAccounts(saNS).CreateToken(e.ctx, saName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var denied deniedRequests
	cfg := cluster.AnonymousConfig()
	cfg.BearerToken = tok.Status.Token
	cfg.WrapTransport = denied.wrap

	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		done <- controller.Serve(ctx, controller.ServeConfig{
			RESTConfig: cfg,
			Registry:   metrics.NewKubeRegistry(),
			Controller: controller.Config{Workers: 4, VerifyPeriod: time.Second},
			Leader: app.LeaderElection{
				Enabled: true, LeaseName: e.prefix + "-rbac", Namespace: saNS, Identity: "rbac",
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			},
		})
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(timeout):
			t.Error("Serve did not return after cancellation")
		}
	}
	t.Cleanup(stop)

	n1, n2 := e.addNode("n1"), e.addNode("n2")
	pv := e.volume("rbac", rwo())
	// The driver fails with one message, then another, then the first
	// again: the third Warning repeats the first, which the event recorder
	// sends as a patch of the first event's count.
	fault := ""
	failWith := func(msg string) {
		t.Helper()
		id, err := drv.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.NotFound, Message: msg})
		if err != nil {
			t.Fatal(err)
		}
		if fault != "" {
			drv.RemoveFault(fault)
		}
		fault = id
	}
	warned := func(msg string, count int32) {
		t.Helper()
		e.eventually(fmt.Sprintf("FailedAttachVolume %q with count %d", msg, count), func() (bool, error) {
			for _, ev := range e.events("first", "FailedAttachVolume") {
				if strings.HasSuffix(ev.Message, msg) && ev.Count >= count {
					return true, nil
				}
			}
			return false, nil
		})
	}
	failWith("no such disk yet")
	e.pod("first", n1, pv)
	warned("no such disk yet", 1)
	failWith("disk is being resized")
	warned("disk is being resized", 1)
	// An attachError's time has second resolution, and the same text at the
	// same time is the same condition (one event): let a second pass.
	time.Sleep(1100 * time.Millisecond)
	failWith("no such disk yet")
	warned("no such disk yet", 2)
	drv.RemoveFault(fault)
	e.waitAttachedVA(pv, n1)
	e.waitNodeAttached(n1, e.unique(pv))
	e.waitPodRunning("first")

	e.pod("second", n2, pv)
	e.waitEvent("second", "FailedAttachVolume", fmt.Sprintf("Multi-Attach error for volume %q Volume is already used by pod(s) first", pv))
	e.deletePod("first")
	e.waitVAGone(pv, n1)
	e.waitNodeAttached(n1)
	e.waitAttachedVA(pv, n2)
	e.waitNodeAttached(n2, e.unique(pv))
	e.waitPodRunning("second")
	e.deletePod("second")
	e.waitVAGone(pv, n2)
	e.waitNodeAttached(n2)

	stop() // releases the Lease: an update
	l, err := e.client.CoordinationV1().Leases(saNS).Get(e.ctx, e.prefix+"-rbac", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Lease: %v", err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after shutdown", *h)
	}
	if got := denied.get(); len(got) != 0 {
		t.Fatalf("%d requests refused for deploy/attachdetach-controller/rbac.yaml:\n%s", len(got), strings.Join(got, "\n"))
	}
}
