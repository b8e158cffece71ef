package attacher_test

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
)

const (
	publishMethod   = "ControllerPublishVolume"
	unpublishMethod = "ControllerUnpublishVolume"
)

// count returns how often s occurs in list.
func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

func TestAttacherKilledMidPublishRepublishesOnlyTheVolumeWhoseOutcomeWasUnknown(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	pv1, va1, pv2, va2 := e.prefix+"-pv1", e.prefix+"-va1", e.prefix+"-pv2", e.prefix+"-va2"
	e.createPV(pv1)
	e.createPV(pv2)
	first := e.startBinary("first")
	e.createVA(e.newVA(va1, pv1, e.node))
	e.waitAttached(va1, time.Minute)

	// The driver publishes pv2 but its reply is held back: when the
	// attacher dies, it cannot know whether the volume got published.
	if _, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, VolumeID: pv2, Phase: csimock.PhaseAfter, Latency: time.Hour, Once: true}); err != nil {
		t.Fatal(err)
	}
	e.createVA(e.newVA(va2, pv2, e.node))
	e.eventually(30*time.Second, "publish of "+pv2+" in flight", func() (bool, error) { return e.inFlight(publishMethod, pv2), nil })
	before := e.getVA(va2)
	if !slices.Contains(before.Finalizers, kubenames.AttacherFinalizer(e.name)) || before.Annotations[kubenames.VANodeIDAnnotation] != e.nodeID {
		t.Fatalf("while publishing, VA has finalizers %v annotations %v: the finalizer and node ID must be written before the driver is called", before.Finalizers, before.Annotations)
	}
	first.kill()
	e.eventually(10*time.Second, "killed publish ended on the driver side", func() (bool, error) { return !e.inFlight(publishMethod, pv2), nil })
	if va := e.getVA(va2); va.Status.Attached {
		t.Fatalf("VA %s marked attached by a process that never got the reply", va2)
	}

	e.startBinary("second")
	e.waitAttached(va2, time.Minute)

	calls := e.callsFor(publishMethod, pv2)
	if len(calls) != 2 || calls[0].Code == codes.OK || calls[1].Code != codes.OK {
		t.Fatalf("publish calls for %s = %+v, want the unanswered one (cancelled by the kill) and one repeat", pv2, calls)
	}
	// The volume whose outcome was known is not published again.
	if calls := e.callsFor(publishMethod, pv1); len(calls) != 1 {
		t.Errorf("publish calls for %s = %d after the restart, want still 1", pv1, len(calls))
	}
	for _, name := range []string{va1, va2} {
		if va := e.getVA(name); count(va.Finalizers, kubenames.AttacherFinalizer(e.name)) != 1 || len(va.Finalizers) != 1 {
			t.Errorf("VA %s finalizers = %v, want exactly ours once", name, va.Finalizers)
		}
	}
	for _, name := range []string{pv1, pv2} {
		pv, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if count(pv.Finalizers, kubenames.PVFinalizer(e.name)) != 1 {
			t.Errorf("PV %s finalizers = %v, want ours once", name, pv.Finalizers)
		}
	}

	// The restarted attacher also detaches cleanly: nothing leaked.
	e.deleteVA(va2)
	e.waitGone(va2)
	if got := e.driver.Published(pv2); len(got) != 0 {
		t.Errorf("%s still published to %v", pv2, got)
	}
}

func TestAttacherKilledMidUnpublishUnpublishesAgainAfterRestartAndReleasesVA(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	first := e.startBinary("first")
	pv, vaName, _ := e.attachOne(time.Minute)

	if _, err := e.driver.AddFault(csimock.Rule{Method: unpublishMethod, VolumeID: pv, Phase: csimock.PhaseAfter, Latency: time.Hour, Once: true}); err != nil {
		t.Fatal(err)
	}
	e.deleteVA(vaName)
	e.eventually(30*time.Second, "unpublish in flight", func() (bool, error) { return e.inFlight(unpublishMethod, pv), nil })
	first.kill()
	e.eventually(10*time.Second, "killed unpublish ended on the driver side", func() (bool, error) { return !e.inFlight(unpublishMethod, pv), nil })
	// Unknown outcome: the VA must still hold our finalizer.
	if va := e.getVA(vaName); !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) {
		t.Fatalf("finalizer removed although the unpublish never answered: %v", va.Finalizers)
	}

	e.startBinary("second")
	e.waitGone(vaName)
	calls := e.callsFor(unpublishMethod, pv)
	if len(calls) != 2 || calls[0].Code == codes.OK || calls[1].Code != codes.OK {
		t.Fatalf("unpublish calls = %+v, want the unanswered one and one repeat", calls)
	}
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Errorf("still published to %v", got)
	}
	if got := e.callsFor(publishMethod, pv); len(got) != 1 {
		t.Errorf("publish calls = %d, want 1 (a deleting VA is never published again)", len(got))
	}
	p, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if count(p.Finalizers, kubenames.PVFinalizer(e.name)) != 1 {
		t.Errorf("PV finalizers = %v, want ours once (the PV is not being deleted)", p.Finalizers)
	}
}

func TestAttacherSIGTERMFinishesInFlightPublishExitsZeroAndReleasesLease(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	// A lease of one minute: within the test, a standby can only take
	// over if the leader releases the lease.
	le := []string{
		"--leader-election", "--leader-election-namespace=default",
		"--leader-election-lease-duration=60s", "--leader-election-renew-deadline=40s", "--leader-election-retry-period=200ms",
	}
	leaseName := kube.LeaseName(e.name)
	holder := func() string {
		l, err := e.client.CoordinationV1().Leases("default").Get(e.ctx, leaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	leader := e.startBinary("leader", le...)
	e.eventually(time.Minute, "lease "+leaseName+" held", func() (bool, error) { return holder() != "", nil })
	leaderID := holder()
	// The standby's driver calls may outlast the drain bound.
	standby := e.startBinary("standby", append(le, "--timeout=5m")...)

	pv1, va1 := e.prefix+"-pv1", e.prefix+"-va1"
	e.createPV(pv1)
	if _, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, VolumeID: pv1, Latency: 3 * time.Second, Once: true}); err != nil {
		t.Fatal(err)
	}
	e.createVA(e.newVA(va1, pv1, e.node))
	e.eventually(30*time.Second, "slow publish in flight", func() (bool, error) { return e.inFlight(publishMethod, pv1), nil })

	leader.signal(syscall.SIGTERM)
	if code := leader.exitCode(time.Minute); code != 0 {
		t.Fatalf("leader exited with %d after SIGTERM, want 0", code)
	}
	// The in-flight call was allowed to finish, and its result recorded,
	// before the process let go.
	calls := e.callsFor(publishMethod, pv1)
	if len(calls) != 1 || !calls[0].Done() || calls[0].Code != codes.OK {
		t.Fatalf("publish calls = %+v, want one that completed OK", calls)
	}
	if va := e.getVA(va1); !va.Status.Attached {
		t.Fatalf("VA %s not attached when the leader exited: the drained publish's status was not written", va1)
	}

	// The standby takes over long before the minute-long lease expires.
	e.eventually(30*time.Second, "standby holds the lease", func() (bool, error) {
		h := holder()
		return h != "" && h != leaderID, nil
	})
	pv2, va2 := e.prefix+"-pv2", e.prefix+"-va2"
	e.createPV(pv2)
	e.createVA(e.newVA(va2, pv2, e.node))
	e.waitAttached(va2, time.Minute)
	if got := len(e.callsFor(publishMethod, pv1)); got != 1 {
		t.Errorf("publish calls for %s = %d after the handover, want 1", pv1, got)
	}

	// The new leader gets SIGTERM while a publish hangs past the drain
	// bound: the publish is cancelled when the drain times out, and the
	// Lease is still released, and the process gone, before the grace
	// period the shipped manifests give the Pod ends, so the kubelet never
	// SIGKILLs a holder and no standby waits out the lease duration.
	grace := shippedGracePeriod(t)
	pv3, va3 := e.prefix+"-pv3", e.prefix+"-va3"
	e.createPV(pv3)
	if _, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, VolumeID: pv3, Hang: true, Once: true}); err != nil {
		t.Fatal(err)
	}
	e.createVA(e.newVA(va3, pv3, e.node))
	e.eventually(30*time.Second, "hanging publish in flight", func() (bool, error) { return e.inFlight(publishMethod, pv3), nil })
	sent := time.Now()
	standby.signal(syscall.SIGTERM)
	e.eventually(grace+10*time.Second, "lease "+leaseName+" released", func() (bool, error) { return holder() == "", nil })
	releasedAfter := time.Since(sent)
	standby.exitCode(grace)
	exitedAfter := time.Since(sent)
	if releasedAfter >= grace || exitedAfter >= grace {
		t.Errorf("with a publish hanging past the drain bound, the Lease was released %s and the process exited %s after SIGTERM; the manifests' grace period is %s, after which the kubelet SIGKILLs it",
			releasedAfter.Round(time.Millisecond), exitedAfter.Round(time.Millisecond), grace)
	}
	t.Logf("hanging publish: Lease released %s, process exited %s after SIGTERM (grace period %s)", releasedAfter.Round(time.Millisecond), exitedAfter.Round(time.Millisecond), grace)
	if calls := e.callsFor(publishMethod, pv3); len(calls) != 1 || !calls[0].Done() || calls[0].Code == codes.OK {
		t.Errorf("publish calls for %s = %+v, want the hanging one, cancelled", pv3, calls)
	}
	if va := e.getVA(va3); va.Status.Attached {
		t.Errorf("VA %s marked attached although its publish was cancelled", va3)
	}
}

// shippedGracePeriod is the shortest terminationGracePeriodSeconds the
// manifests that run csi-attacher give its Pod: the example driver
// Deployment and the chart's driver.
func shippedGracePeriod(t *testing.T) time.Duration {
	t.Helper()
	var grace time.Duration
	for _, f := range []struct{ file, path string }{
		{"deploy/examples/mock-driver/deployment.yaml", "spec.template.spec.terminationGracePeriodSeconds"},
		{"charts/latch/values.yaml", "driver.terminationGracePeriodSeconds"},
	} {
		raw, err := testsupport.RepoFile(f.file)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f.file, err)
		}
		v, _, _ := unstructured.NestedFieldNoCopy(doc, strings.Split(f.path, ".")...)
		secs, ok := v.(float64) // YAML numbers decode as float64
		if !ok {
			t.Fatalf("%s has no number at %s", f.file, f.path)
		}
		if d := time.Duration(secs) * time.Second; grace == 0 || d < grace {
			grace = d
		}
	}
	return grace
}
