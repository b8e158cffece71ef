package attachdetach_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/testsupport"
)

// createOutcome is how an injected VolumeAttachment create ends for the
// client after the API server stored the object.
type createOutcome struct {
	name string
	// code and reason of the answer the controller gets; code 0: no
	// answer reaches it (a connection error).
	code   int
	reason metav1.StatusReason
}

var (
	// outcomeInternalError: the server's answer is a 500.
	outcomeInternalError = createOutcome{"500", http.StatusInternalServerError, ""}
	// outcomeTimeout: no answer reaches the client.
	outcomeTimeout = createOutcome{"timeout", 0, ""}
	// outcomeAlreadyExists: the answer is 409 AlreadyExists, as for a
	// retried create whose first attempt's answer was lost.
	outcomeAlreadyExists = createOutcome{"exists", http.StatusConflict, metav1.StatusReasonAlreadyExists}
)

// A VolumeAttachment create that reached the API server but whose answer
// the controller did not get (a 500, no answer at all, or AlreadyExists),
// while the controller's informer lags behind: the Pod goes away and
// another Pod wants the ReadWriteOnce volume on node 2. The controller
// must count the first VolumeAttachment as "may exist" until the API
// server says otherwise, so the volume is unpublished from node 1 before
// it is published to node 2, and never is on both. Each outcome runs
// twice.
func TestUnknownCreateOutcome_mayExistUntilTheAPIServerSaysNo(t *testing.T) {
	api := testsupport.NewAPITransport()
	e, drv := newRecordingEnv(t, controller.Config{}, api.Wrap)
	n1, n2 := e.addNode("n1"), e.addNode("n2")
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
		t.Run(fmt.Sprintf("%s#%d", outcome.name, i/len(outcomes)), func(t *testing.T) {
			e.t = t
			pv := e.volume(fmt.Sprintf("v%d", i), v1.ReadWriteOnce)
			p1, p2 := pv+"-p1", pv+"-p2"

			va := e.vaName(pv, n1)
			fault := api.FailAfterWriteWith(testsupport.Match{Method: "create", Resource: "volumeattachments", Name: va}, 1,
				outcome.code, outcome.reason, fmt.Sprintf("injected: the answer to the stored create of %s was lost", va))
			defer api.Remove(fault)
			lag := api.LagWatches(testsupport.Match{Resource: "volumeattachments"})
			defer api.Remove(lag)
			e.pod(p1, n1, pv)
			e.eventually("the controller's create of "+va, func() (bool, error) { return api.Fired(fault) > 0, nil })
			// csi-attacher (whose informer does not lag) publishes it.
			e.waitAttachedVA(pv, n1)

			e.deletePod(p1)
			e.waitPodGone(p1)
			e.pod(p2, n2, pv)
			// Time for a wrong decision to be made and carried out while
			// the informer still has not shown the first VolumeAttachment.
			time.Sleep(1500 * time.Millisecond)
			api.Remove(lag)

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
