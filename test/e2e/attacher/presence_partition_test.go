package attacher_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport"
)

// Two csi-attacher replicas of one driver without --leader-election
// (presence mode). Replica a works; a VolumeAttachment's publish keeps
// failing (Unavailable), so a retries it with backoff. Then a is cut off
// from the API server (its driver, the sidecar next to it, still answers)
// and b takes the Lease over once a's lease duration has passed. The
// VolumeAttachment is deleted (the Pod moved away): b unpublishes the
// volume and drops the finalizer, the VA is gone. Before the fix, a kept
// working through its failed renewals: its scheduled retry, from a stale
// cache, published the volume to the old node again after the VA was
// gone, its status write failed (partitioned), and when the partition
// healed a saw b holding the Lease and exited: a leaked publication of an
// RWO volume. Now a stops at its renew deadline, before b can take over:
// no publish comes after the VA is gone and nothing stays published.
func TestPresencePartitionedReplicaStopsBeforeAnotherTakesOver_noPublishAfterTheVAIsGone(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})

	// Replica a, with a transport that can cut it off quickly.
	aAPI := testsupport.NewAPITransport()
	aAPI.SetPartitionTimeout(300 * time.Millisecond)
	aCfg := cluster.RESTConfig()
	var cut atomic.Bool
	aCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return watchCutter{aAPI.Wrap(rt), &cut} }
	// Run a outside the stack: its exit (another instance holds the
	// Lease) is the expected end here, not a test error.
	aCtx, stopA := context.WithCancel(klog.NewContext(e.ctx, klog.Background().WithName("replica-a")))
	aDone := make(chan error, 1)
	go func() {
		aDone <- attacher.RunSidecar(aCtx, e.attacherConfig(aCfg, envOptions{}, "replica-a", "default"))
	}()
	defer func() { stopA(); <-aDone }()

	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	fault, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.Unavailable, Message: "backend busy"})
	if err != nil {
		t.Fatal(err)
	}
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	// Let a's backoff grow (100ms doubling): after 7 failed publishes the
	// next retry comes 6.4s later.
	e.eventually(30*time.Second, "7 failed publishes by a", func() (bool, error) {
		return len(e.callsFor("ControllerPublishVolume", pv)) >= 7, nil
	})
	aAPI.Partition()
	cut.Store(true)
	partitioned := time.Now()

	// Replica b (not partitioned) takes the Lease over after a's lease
	// duration and works.
	stopB := e.startAttacherAs(cluster.RESTConfig(), envOptions{}, "replica-b", "default")
	defer stopB()

	// The Pod moved away: the VA is deleted; b detaches it.
	time.Sleep(2500 * time.Millisecond)
	e.deleteVA(vaName)
	e.waitGone(vaName)
	t.Logf("VA %s detached by b and gone %s after a was partitioned; unpublishes: %d",
		vaName, time.Since(partitioned).Round(time.Millisecond), len(e.callsFor("ControllerUnpublishVolume", pv)))
	gone := time.Now()
	e.driver.RemoveFault(fault)

	// a's retry (from its stale cache) comes within its backoff.
	time.Sleep(8 * time.Second)
	aAPI.Heal()
	cut.Store(false)
	time.Sleep(5 * time.Second)

	var after []string
	for _, c := range e.callsFor("ControllerPublishVolume", pv) {
		if c.Start.After(gone) && c.Code == codes.OK {
			after = append(after, c.Start.Format("15:04:05.000"))
		}
	}
	if len(after) > 0 {
		t.Errorf("ControllerPublish of %s succeeded after its VolumeAttachment was gone, at %s: replica a worked on beside b", pv, strings.Join(after, ", "))
	}
	if pub := e.driver.Published(pv); slices.Contains(pub, e.nodeID) {
		t.Errorf("leaked publication: volume %s is published to %s (driver: %v) although its VolumeAttachment %s was detached and is gone; successful ControllerPublish after the VA was gone at: %s",
			pv, e.nodeID, pub, vaName, strings.Join(after, ", "))
	}
}

// watchCutter ends the watches already open when cut is set, as a network
// partition does (testsupport.APITransport's Partition fails new requests
// but lets an open watch stream keep delivering events).
type watchCutter struct {
	rt  http.RoundTripper
	cut *atomic.Bool
}

func (w watchCutter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.rt.RoundTrip(req)
	if err == nil && req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true" {
		resp.Body = cutBody{resp.Body, w.cut}
	}
	return resp, err
}

type cutBody struct {
	io.ReadCloser
	cut *atomic.Bool
}

func (b cutBody) Read(p []byte) (int, error) {
	if b.cut.Load() {
		b.ReadCloser.Close()
		return 0, errors.New("connection cut (partitioned)")
	}
	n, err := b.ReadCloser.Read(p)
	if b.cut.Load() {
		b.ReadCloser.Close()
		return 0, errors.New("connection cut (partitioned)")
	}
	return n, err
}
