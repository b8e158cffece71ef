package attachdetach_test

import (
	"errors"
	"slices"
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
func (w *startStates) serve(id string, elect bool) *servedController {
	e := w.e
	s := &servedController{id: id, api: testsupport.NewAPITransport()}
	s.api.SetPartitionTimeout(2 * time.Second)
	w.log.add(s.api)
	c := e.stack.StartController(e.ctx, func(cfg *controller.ServeConfig) {
		cfg.RESTConfig.QPS, cfg.RESTConfig.Burst = 1000, 2000
		cfg.RESTConfig.Wrap(s.api.Wrap)
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
func (w *startStates) waitLeader(s *servedController) {
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

// apiLog holds the API transports of every controller of a test.
type apiLog struct {
	mu   sync.Mutex
	apis []*testsupport.APITransport
}

func (l *apiLog) add(api *testsupport.APITransport) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.apis = append(l.apis, api)
}

// since returns the writes of every controller the API server answered
// after from, in the order answered.
func (l *apiLog) since(from time.Time) []testsupport.Write {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []testsupport.Write
	for _, api := range l.apis {
		for _, w := range api.Writes() {
			if w.Err == nil && w.At.After(from) {
				out = append(out, w)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b testsupport.Write) int { return a.At.Compare(b.At) })
	return out
}
