package attacher_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/diagnose"
	"github.com/latchcsi/latch/internal/diagnose/fetch"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// applyLeaseOnlyRBAC creates deploy/csi-attacher/rbac.yaml in namespace ns,
// under names of the test's own, without the orphan record's Role: what a
// driver that switches from upstream usually has (its Lease Role and the
// ClusterRole) plus the events rule.
func applyLeaseOnlyRBAC(t *testing.T, e *env, ns string) {
	t.Helper()
	base, err := testsupport.RepoFile("deploy/csi-attacher/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kept [][]byte
	for _, doc := range bytes.Split(base, []byte("\n---\n")) {
		if bytes.Contains(doc, []byte("name: latch-csi-attacher-orphans")) {
			continue
		}
		doc = bytes.ReplaceAll(doc, []byte("latch-system"), []byte(ns))
		doc = bytes.ReplaceAll(doc, []byte("name: latch-csi-attacher"), []byte("name: "+e.prefix+"-csi-attacher"))
		kept = append(kept, doc)
	}
	if err := localcluster.CreateNamespace(e.ctx, e.client, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := testsupport.ApplyRBAC(e.ctx, e.client, bytes.Join(kept, []byte("\n---\n"))); err != nil {
		t.Fatal(err)
	}
}

// gaugeValue reads a gauge of the process-wide registry (-1 when absent).
func gaugeValue(t *testing.T, name string) float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// A driver's usual Lease-only Role, which docs/migration.md used to say
// could stay: the API server forbids csi-attacher its orphan record.
// VolumeAttachments are attached all the same (upstream's behaviour; the
// record only protects orphans across restarts), and the operator is told
// where they look: a Warning OrphanRecordFailed event on the Lease with the
// exact Role rule, the metrics, latchctl's problem finding with that rule,
// and the attachError of a VolumeAttachment that waits for an orphan that
// could not be recorded.
func TestLeaseOnlyRBACAttachesAndSaysWhichRuleTheOrphanRecordNeeds(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	ns := e.prefix + "-ns"
	applyLeaseOnlyRBAC(t, e, ns)
	cfg, err := cluster.ServiceAccountConfig(e.ctx, ns, "csi-attacher")
	if err != nil {
		t.Fatal(err)
	}
	stop := e.startAttacherAs(cfg, envOptions{leader: true}, "lease-only", ns)
	defer stop()
	rule := kube.OrphanRecordRule(ns, e.name)

	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttached(vaName, 30*time.Second)

	var leaseEvent string
	e.eventually(10*time.Second, "Warning OrphanRecordFailed on the Lease", func() (bool, error) {
		evs, err := e.client.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Lease,involvedObject.name=" + kube.LeaseName(e.name)})
		if err != nil {
			return false, nil
		}
		for _, ev := range evs.Items {
			if ev.Reason == attacher.EventOrphanRecordFailed && ev.Type == "Warning" {
				leaseEvent = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	for _, want := range []string{ns + "/" + attacher.OrphanRecordName(e.name), "RBAC forbids it", "in memory only", rule} {
		if !strings.Contains(leaseEvent, want) {
			t.Errorf("Lease event %q does not say %q", leaseEvent, want)
		}
	}
	if got := counterValue(t, "latch_attacher_orphan_record_errors_total", "operation", "load"); got < 1 {
		t.Errorf("latch_attacher_orphan_record_errors_total{operation=load} = %v, want the refused read counted", got)
	}
	if got := gaugeValue(t, "latch_attacher_orphan_record_unavailable"); got != 1 {
		t.Errorf("latch_attacher_orphan_record_unavailable = %v, want 1", got)
	}

	snap, err := fetch.Snapshot(e.ctx, e.client, diagnose.Target{Kind: diagnose.TargetVA, Name: vaName}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	report := diagnose.Explain(diagnose.Target{Kind: diagnose.TargetVA, Name: vaName}, snap)
	found := false
	for _, f := range report.Findings {
		found = found || f.Check == "attacher.orphanRecord" && f.Status == diagnose.StatusProblem && strings.Contains(f.Hint, rule)
	}
	if !found || report.Healthy() {
		t.Errorf("latchctl explain of %s: want a problem attacher.orphanRecord with the rule %s; got %+v", vaName, rule, report.Findings)
	}

	// An orphan now: a new VolumeAttachment of its name (another node)
	// waits for it, and its attachError says the orphan is in memory only
	// and which rule would record it.
	node2 := e.prefix + "-n2"
	e.createCSINode(node2, node2+"-id")
	pv2, va2 := e.prefix+"-pv2", e.prefix+"-va2"
	e.createPV(pv2)
	_, unpublishFault := e.orphanWithFailingUnpublish(pv2, va2)
	e.createVA(e.newVA(va2, pv2, node2))
	va := e.waitAttachError(va2, "tracked in memory only")
	if !strings.Contains(va.Status.AttachError.Message, rule) {
		t.Errorf("attachError %q of %s does not name the rule %s", va.Status.AttachError.Message, va2, rule)
	}
	e.driver.RemoveFault(unpublishFault)
	e.waitAttached(va2, 30*time.Second)
	if got := e.driver.Published(pv2); len(got) != 1 || got[0] != node2+"-id" {
		t.Errorf("%s published to %v, want only %s", pv2, got, fmt.Sprint(node2+"-id"))
	}
}

// The record's ConfigMap as the real API server refuses it: immutable, or
// holding the VolumeAttachment's name as a binaryData key. The orphan is
// tracked in memory, a new VolumeAttachment of its name (another node)
// says in its attachError why the orphan is not recorded and how to mend
// the ConfigMap, and is attached once the orphan's unpublish succeeds.
func TestOrphanRecordTheAPIServerRefusesHoldsNothingBack(t *testing.T) {
	for _, shape := range []struct {
		name string
		cm   func(key string) *v1.ConfigMap
	}{
		{"immutable", func(string) *v1.ConfigMap {
			immutable := true
			return &v1.ConfigMap{Immutable: &immutable, Data: map[string]string{}}
		}},
		{"binaryData key", func(key string) *v1.ConfigMap {
			return &v1.ConfigMap{BinaryData: map[string][]byte{key: []byte("x")}}
		}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			node2 := e.prefix + "-n2"
			e.createCSINode(node2, node2+"-id")
			pv, vaName := e.prefix+"-pv", e.prefix+"-va"
			cm := shape.cm(vaName)
			cm.Namespace, cm.Name = "default", attacher.OrphanRecordName(e.name)
			if _, err := e.client.CoreV1().ConfigMaps("default").Create(e.ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.createPV(pv)
			_, unpublishFault := e.orphanWithFailingUnpublish(pv, vaName)
			e.createVA(e.newVA(vaName, pv, node2))
			va := e.waitAttachError(vaName, "tracked in memory only")
			for _, want := range []string{"default/" + attacher.OrphanRecordName(e.name), "refuses the ConfigMap", "re-create it without immutable and binaryData"} {
				if !strings.Contains(va.Status.AttachError.Message, want) {
					t.Errorf("attachError %q does not say %q", va.Status.AttachError.Message, want)
				}
			}
			if msg := e.eventMessage(vaName, attacher.EventOrphanRecordFailed); !strings.Contains(msg, "re-create it") {
				t.Errorf("%s event %q does not say how to mend the ConfigMap", attacher.EventOrphanRecordFailed, msg)
			}
			e.driver.RemoveFault(unpublishFault)
			e.waitAttached(vaName, 30*time.Second)
			if got := e.driver.Published(pv); len(got) != 1 || got[0] != node2+"-id" {
				t.Errorf("%s published to %v, want only %s", pv, got, node2+"-id")
			}
		})
	}
}
