package attacher_test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// runbookRBACMarker precedes, in docs/migration.md, the YAML block the
// runbook tells the operator to apply beside the driver's own RBAC.
const runbookRBACMarker = "<!-- runbook-rbac:"

// runbookRBAC returns that block as written, with its placeholders
// (NAMESPACE, SERVICEACCOUNT, DRIVER) filled in.
func runbookRBAC(t *testing.T, ns, serviceAccount, driver string) []byte {
	t.Helper()
	doc, err := testsupport.RepoFile("docs/migration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(doc, []byte(runbookRBACMarker))
	if !ok {
		t.Fatalf("docs/migration.md has no %q block", runbookRBACMarker)
	}
	_, block, ok := bytes.Cut(after, []byte("```yaml\n"))
	if !ok {
		t.Fatal("docs/migration.md: no yaml block after the runbook RBAC marker")
	}
	block, _, ok = bytes.Cut(block, []byte("```"))
	if !ok {
		t.Fatal("docs/migration.md: the runbook RBAC block does not end")
	}
	// As the doc says: DRIVER is what follows the prefix in the Lease's name.
	sanitized, ok := strings.CutPrefix(kube.LeaseName(driver), "external-attacher-leader-")
	if !ok {
		t.Fatalf("Lease name %q", kube.LeaseName(driver))
	}
	return []byte(strings.NewReplacer("NAMESPACE", ns, "SERVICEACCOUNT", serviceAccount, "DRIVER", sanitized).Replace(string(block)))
}

// The migration runbook's attacher swap, RBAC included: upstream's
// external-attacher runs as a driver's ServiceAccount whose RBAC is what
// driver charts ship (upstream's ClusterRole and a Lease-only Role,
// testdata/driver-chart-rbac.yaml) and attaches a volume; then the block
// docs/migration.md tells the operator to apply is applied as written, and
// latch's csi-attacher replaces upstream's, as the same ServiceAccount with
// leader election: it detaches upstream's attachment, attaches and
// detaches, and records an orphaned publication in its ConfigMap and undoes
// it, with no OrphanRecordFailed warning.
func TestMigrationRunbook_driverChartRBACPlusTheDocumentedRulesAttachesAndRecordsOrphans(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	ns := e.prefix + "-ns"
	if err := localcluster.CreateNamespace(e.ctx, e.client, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	chart, err := testsupport.RepoFile("test/e2e/attacher/testdata/driver-chart-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	chart = []byte(strings.NewReplacer("NAMESPACE", ns, "PREFIX", e.prefix).Replace(string(chart)))
	if _, err := testsupport.ApplyRBAC(e.ctx, e.client, chart); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.ServiceAccountConfig(e.ctx, ns, "csi-attacher")
	if err != nil {
		t.Fatal(err)
	}

	// Before: upstream's external-attacher, with leader election, as the
	// driver's ServiceAccount, attaches a volume.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := localcluster.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	up, err := stack.StartUpstreamAttacher(e.ctx, stack.UpstreamAttacherConfig{
		CSIAddress: e.socket, Kubeconfig: kubeconfig, LeaderElection: true, LeaderElectionNamespace: ns,
	})
	if err != nil {
		t.Fatal(err)
	}
	pv0, va0 := e.prefix+"-pv0", e.prefix+"-va0"
	e.createPV(pv0)
	e.createVA(e.newVA(va0, pv0, e.node))
	e.waitAttached(va0, 30*time.Second)

	// The runbook: apply its RBAC block, swap the attacher.
	if _, err := testsupport.ApplyRBAC(e.ctx, e.client, runbookRBAC(t, ns, "csi-attacher", e.name)); err != nil {
		t.Fatal(err)
	}
	if err := up.Stop(); err != nil {
		t.Errorf("external-attacher: %v", err)
	}
	stop := e.startAttacherAs(cfg, envOptions{leader: true}, "runbook", ns)
	defer stop()

	// The upstream attacher's attachment is detached by latch's (after
	// upstream's Lease, which it does not release, expired).
	e.deleteVA(va0)
	e.waitGone(va0)
	if got := e.driver.Published(pv0); len(got) != 0 {
		t.Errorf("%s still published to %v after the detach", pv0, got)
	}

	// Attach and detach.
	pv, va := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.createVA(e.newVA(va, pv, e.node))
	e.waitAttached(va, 30*time.Second)
	e.deleteVA(va)
	e.waitGone(va)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Errorf("%s still published to %v after the detach", pv, got)
	}

	// An orphaned publication is recorded in the ConfigMap, then undone
	// and dropped from it.
	pv2, va2 := e.prefix+"-pv2", e.prefix+"-va2"
	e.createPV(pv2)
	_, unpublishFault := e.orphanWithFailingUnpublish(pv2, va2)
	record := attacher.OrphanRecordName(e.name)
	recorded := func() (string, error) {
		cm, err := e.client.CoreV1().ConfigMaps(ns).Get(e.ctx, record, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		var all strings.Builder
		for _, v := range cm.Data {
			all.WriteString(v)
		}
		return all.String(), nil
	}
	e.eventually(30*time.Second, "the orphan of "+va2+" in ConfigMap "+ns+"/"+record, func() (bool, error) {
		s, err := recorded()
		return strings.Contains(s, va2), err
	})
	e.driver.RemoveFault(unpublishFault)
	e.eventually(30*time.Second, pv2+" unpublished and its orphan out of the record", func() (bool, error) {
		s, err := recorded()
		return len(e.driver.Published(pv2)) == 0 && !strings.Contains(s, va2), err
	})

	evs, err := e.client.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Lease,involvedObject.name=" + kube.LeaseName(e.name)})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.Reason == attacher.EventOrphanRecordFailed {
			t.Errorf("Warning %s on the Lease: %s", ev.Reason, ev.Message)
		}
	}
}
