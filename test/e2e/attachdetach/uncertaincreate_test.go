package attachdetach_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/testsupport"
)

// createOutcome is how an injected VolumeAttachment create ends for the
// client after the API server stored the object.
type createOutcome string

const (
	// outcomeInternalError: the server's answer is a 500.
	outcomeInternalError createOutcome = "500"
	// outcomeTimeout: no answer reaches the client.
	outcomeTimeout createOutcome = "timeout"
	// outcomeAlreadyExists: the answer is 409 AlreadyExists, as for a
	// retried create whose first attempt's answer was lost.
	outcomeAlreadyExists createOutcome = "exists"
)

// apiFaults sits in the controller's API transport. An armed fault lets
// the next create of one VolumeAttachment reach the API server and then
// replaces the answer the controller gets; lag holds back the events of
// the controller's VolumeAttachment watch (an informer that lags).
type apiFaults struct {
	mu      sync.Mutex
	target  string
	outcome createOutcome
	// fired receives the outcome once an armed fault acted.
	fired chan createOutcome
	lag   atomic.Bool
}

func newAPIFaults() *apiFaults { return &apiFaults{fired: make(chan createOutcome, 1)} }

// arm makes the next create of the VolumeAttachment name end with outcome.
func (f *apiFaults) arm(name string, outcome createOutcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target, f.outcome = name, outcome
}

// take disarms and returns the fault if body is a create of its target.
func (f *apiFaults) take(body []byte) (string, createOutcome, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.target == "" || !bytes.Contains(body, []byte(f.target)) {
		return "", "", false
	}
	name, outcome := f.target, f.outcome
	f.target = ""
	return name, outcome, true
}

func (f *apiFaults) wrap(rt http.RoundTripper) http.RoundTripper {
	return testsupport.RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		isVAs := strings.HasSuffix(req.URL.Path, "/volumeattachments")
		if isVAs && req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true" {
			resp, err := rt.RoundTrip(req)
			if err == nil {
				resp.Body = newLaggingBody(resp.Body, &f.lag)
			}
			return resp, err
		}
		if !isVAs || req.Method != http.MethodPost || req.Body == nil {
			return rt.RoundTrip(req)
		}
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		name, outcome, armed := f.take(body)
		if !armed {
			return rt.RoundTrip(req)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return nil, fmt.Errorf("injected create of %s was not stored: HTTP %d", name, resp.StatusCode)
		}
		f.fired <- outcome
		switch outcome {
		case outcomeTimeout:
			return nil, fmt.Errorf("injected: no answer for the create of %s: %w", name, context.DeadlineExceeded)
		case outcomeAlreadyExists:
			return statusResponse(req, http.StatusConflict, metav1.StatusReasonAlreadyExists, name,
				fmt.Sprintf("volumeattachments.storage.k8s.io %q already exists", name)), nil
		default:
			return statusResponse(req, http.StatusInternalServerError, metav1.StatusReasonInternalError, name,
				"Internal error occurred: injected: the answer to a stored create was lost"), nil
		}
	})
}

// statusResponse is an API server error answer.
func statusResponse(req *http.Request, code int, reason metav1.StatusReason, name, msg string) *http.Response {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
		Details: &metav1.StatusDetails{Name: name, Group: "storage.k8s.io", Kind: "volumeattachments"},
	}
	b, _ := json.Marshal(st)
	return &http.Response{
		StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(b)),
		ContentLength: int64(len(b)),
		Request:       req,
	}
}

// laggingBody passes a watch stream through, except that while lag is
// set nothing more reaches the reader (data that arrives meanwhile is
// held, not lost).
type laggingBody struct {
	rc      io.ReadCloser
	lag     *atomic.Bool
	chunks  chan []byte
	err     error // set before chunks is closed
	pending []byte
	closed  chan struct{}
	once    sync.Once
}

func newLaggingBody(rc io.ReadCloser, lag *atomic.Bool) *laggingBody {
	b := &laggingBody{rc: rc, lag: lag, chunks: make(chan []byte), closed: make(chan struct{})}
	go b.pump()
	return b
}

func (b *laggingBody) pump() {
	for {
		buf := make([]byte, 32<<10)
		n, err := b.rc.Read(buf)
		if n > 0 {
			select {
			case b.chunks <- buf[:n]:
			case <-b.closed:
				return
			}
		}
		if err != nil {
			b.err = err
			close(b.chunks)
			return
		}
	}
}

func (b *laggingBody) Read(p []byte) (int, error) {
	if len(b.pending) == 0 {
		select {
		case c, ok := <-b.chunks:
			if !ok {
				return 0, b.err
			}
			b.pending = c
		case <-b.closed:
			return 0, io.EOF
		}
	}
	// Data that arrived while lagging waits until the lag ends.
	for b.lag.Load() {
		select {
		case <-b.closed:
			return 0, io.EOF
		case <-time.After(5 * time.Millisecond):
		}
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *laggingBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.rc.Close()
}

// A VolumeAttachment create that reached the API server but whose answer
// the controller did not get (a 500, no answer at all, or AlreadyExists),
// while the controller's informer lags behind: the Pod goes away and
// another Pod wants the ReadWriteOnce volume on node 2. The controller
// must count the first VolumeAttachment as "may exist" until the API
// server says otherwise, so the volume is unpublished from node 1 before
// it is published to node 2, and never is on both. Each outcome runs
// twice.
func TestUnknownCreateOutcome_mayExistUntilTheAPIServerSaysNo(t *testing.T) {
	faults := newAPIFaults()
	e, drv := newRecordingEnv(t, controller.Config{}, faults.wrap)
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	defer faults.lag.Store(false)
	// A first attach proves the controller's informers synced: from
	// then on its VolumeAttachment watch only carries new events, which
	// the test holds back.
	warm := e.volume("warm")
	e.pod("warm", n1, warm)
	e.waitNodeAttached(n1, e.unique(warm))
	e.deletePod("warm")
	e.waitVAGone(warm, n1)

	outcomes := []createOutcome{outcomeInternalError, outcomeTimeout, outcomeAlreadyExists}
	for i := range 2 * len(outcomes) {
		outcome := outcomes[i%len(outcomes)]
		t.Run(fmt.Sprintf("%s#%d", outcome, i/len(outcomes)), func(t *testing.T) {
			e.t = t
			pv := e.volume(fmt.Sprintf("v%d", i), v1.ReadWriteOnce)
			p1, p2 := pv+"-p1", pv+"-p2"

			faults.arm(e.vaName(pv, n1), outcome)
			faults.lag.Store(true)
			e.pod(p1, n1, pv)
			select {
			case <-faults.fired:
			case <-time.After(timeout):
				t.Fatalf("the controller did not create the VolumeAttachment of %s on %s", pv, n1)
			}
			// csi-attacher (whose informer does not lag) publishes it.
			e.waitAttachedVA(pv, n1)

			e.deletePod(p1)
			e.waitPodGone(p1)
			e.pod(p2, n2, pv)
			// Time for a wrong decision to be made and carried out while
			// the informer still has not shown the first VolumeAttachment.
			time.Sleep(1500 * time.Millisecond)
			faults.lag.Store(false)

			e.waitVAGone(pv, n1)
			e.waitAttachedVA(pv, n2)
			checkHandedOver(t, drv, pv, n1+"-id", n2+"-id")

			e.deletePod(p2)
			e.waitPodGone(p2)
			e.waitVAGone(pv, n2)
		})
		if t.Failed() {
			break
		}
	}
	e.t = t
}
