package attachdetach_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// servedController is one controller.Serve, the code the binary runs.
type servedController struct {
	id    string
	api   *testsupport.APITransport // Partition cuts it off the API server
	stopF func(kill bool)
}

func (s *servedController) stop() { s.stopF(false) }

// kill cuts the replica's network, then stops it without waiting.
func (s *servedController) kill() { s.stopF(true) }

// serve starts controller.Serve as id, with leader election when elect.
func (w *startWorld) serve(id string, elect bool) *servedController {
	e := w.e
	s := &servedController{id: id, api: testsupport.NewAPITransport()}
	s.api.SetPartitionTimeout(2 * time.Second)
	c := e.stack.StartController(e.ctx, func(cfg *controller.ServeConfig) {
		cfg.RESTConfig.QPS, cfg.RESTConfig.Burst = 1000, 2000
		cfg.RESTConfig.Wrap(s.api.Wrap)
		cfg.RESTConfig.Wrap(w.log.wrap(id))
		cfg.Controller = w.ctrlConfig()
		cfg.Leader = app.LeaderElection{Enabled: elect, LeaseName: e.prefix + "-leader", Namespace: e.ns, Identity: id}
		stack.QuickLease(&cfg.Leader)
	})
	c.StopTimeout = timeout
	var once sync.Once
	s.stopF = func(kill bool) {
		once.Do(func() {
			if kill {
				// The stack awaits it at cleanup.
				s.api.Partition()
				c.Kill()
				return
			}
			if err := c.Stop(); err != nil && !errors.Is(err, app.ErrLostLease) {
				e.t.Errorf("controller %s: Serve: %v", id, err)
			}
		})
	}
	e.t.Cleanup(s.stop)
	return s
}

// waitLeader waits until s holds the Lease.
func (w *startWorld) waitLeader(s *servedController) {
	e := w.e
	e.eventually("replica "+s.id+" leading", func() (bool, error) {
		l, err := e.client.CoordinationV1().Leases(e.ns).Get(e.ctx, e.prefix+"-leader", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == s.id, nil
	})
}

// apiLog records the API writes (not events, not Leases) that the API
// server accepted or refused, of every controller of a test.
type apiLog struct {
	mu     sync.Mutex
	writes []apiWrite
}

type apiWrite struct {
	who, method, path string
	code              int
}

func (l *apiLog) wrap(who string) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return testsupport.RoundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err != nil || req.Method == http.MethodGet || strings.Contains(req.URL.Path, "/events") || strings.Contains(req.URL.Path, "/leases") {
				return resp, err
			}
			l.mu.Lock()
			l.writes = append(l.writes, apiWrite{who: who, method: req.Method, path: req.URL.Path, code: resp.StatusCode})
			l.mu.Unlock()
			return resp, err
		})
	}
}

func (l *apiLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes)
}

func (l *apiLog) since(i int) []apiWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]apiWrite(nil), l.writes[i:]...)
}
