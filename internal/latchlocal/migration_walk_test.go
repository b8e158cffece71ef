package latchlocal

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/testsupport"
)

// migrationSection is the part of docs/migration.md the walk runs.
const migrationSection = "## Rehearsing the swap on latch-local"

// runbookRBACBlock is the RBAC block of docs/migration.md (after its
// runbook-rbac marker) as written, placeholders and all: what the operator
// saves as latch-attacher-rbac.yaml.
func runbookRBACBlock(t *testing.T) []byte {
	t.Helper()
	doc, err := testsupport.RepoFile("docs/migration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(doc, []byte("<!-- runbook-rbac:"))
	if !ok {
		t.Fatal("docs/migration.md has no runbook-rbac marker")
	}
	_, block, ok := bytes.Cut(after, []byte("```yaml\n"))
	if !ok {
		t.Fatal("docs/migration.md: no yaml block after the runbook-rbac marker")
	}
	block, _, ok = bytes.Cut(block, []byte("```"))
	if !ok {
		t.Fatal("docs/migration.md: the runbook RBAC block does not end")
	}
	return block
}

// publishes counts the driver's successful calls of method for volume.
func publishes(env *Env, method, volume string) int {
	n := 0
	for _, c := range env.Driver.Calls() {
		if c.Method == method && c.VolumeID == volume && c.Done() && c.Code == codes.OK {
			n++
		}
	}
	return n
}

// docs/migration.md's latch-local section as an operator follows it:
// `latch-local up --upstream` (in-process here, so that the test sees the
// mock driver's calls; without metrics ports), then every other command of
// the section as written, in order, in bash (kubectl, kubectl latch and
// the latch-local binary on PATH), each output block compared with what
// its commands print. Between the commands, what the section says happens
// is checked: upstream's pair attaches the StatefulSet (external-attacher
// holds the Lease, kube-controller-manager creates the VolumeAttachments);
// latch's csi-attacher takes the Lease over once external-attacher
// stopped; latch-local refuses to run both attach/detach controllers;
// latch's controller takes its Lease; a new Pod's volume is attached by
// latch's pair (published once, latch's annotations on its
// VolumeAttachment) and detached; the StatefulSet's volumes keep their
// VolumeAttachments through both swaps and back, with one
// ControllerPublishVolume each and no ControllerUnpublishVolume until the
// StatefulSet is deleted; after switching back, upstream's attacher holds
// the Lease again and upstream's pair detaches them.
func TestMigrationOnLatchLocal_upstreamToLatchAsTheDocsShow(t *testing.T) {
	steps := docShellSteps(t, "docs/migration.md", migrationSection)
	logs := &testsupport.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("child processes' log (tail):\n%s", lastLines(logs.String(), 150))
		}
	})
	sh := newShell(t, t.Context())
	if err := os.WriteFile(filepath.Join(sh.dir, "latch-attacher-rbac.yaml"), runbookRBACBlock(t), 0o600); err != nil {
		t.Fatal(err)
	}

	var (
		ctx  context.Context
		env  *Env
		webs = []string{"web-data-1", "web-data-2"}
		// uids are the StatefulSet's VolumeAttachments, made by
		// upstream's pair: they stay through the swaps.
		uids = map[string]types.UID{}
		// pubs are the StatefulSet's volumes' publishes by upstream's
		// pair: at least one (upstream's attacher may publish twice after
		// reading its own write from a stale cache, docs/interop.md), and
		// no more after it.
		pubs = map[string]int{}
		// The attacher Lease's holders: external-attacher's (its host
		// name), then latch's csi-attacher's.
		upstreamHolder, latchHolder string
	)
	lease := func(ns, name string) string {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	attacherLease := kube.LeaseName(env0Driver)
	vaOf := func(pv string) (*storagev1.VolumeAttachment, bool) {
		vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i, va := range vas.Items {
			if p := va.Spec.Source.PersistentVolumeName; p != nil && *p == pv {
				return &vas.Items[i], true
			}
		}
		return nil, false
	}
	// kept checks the StatefulSet's volumes: attached, same
	// VolumeAttachments, published no more than by upstream's pair, never
	// unpublished.
	kept := func(when string) {
		t.Helper()
		for _, pv := range webs {
			va, ok := vaOf(pv)
			switch {
			case !ok || !va.Status.Attached:
				t.Errorf("%s: %s has no attached VolumeAttachment", when, pv)
			case uids[pv] != "" && va.UID != uids[pv]:
				t.Errorf("%s: %s's VolumeAttachment was re-created (uid %s, was %s)", when, pv, va.UID, uids[pv])
			}
			if p, u := publishes(env, "ControllerPublishVolume", pv), publishes(env, "ControllerUnpublishVolume", pv); p != pubs[pv] || u != 0 {
				t.Errorf("%s: %s published %d times (%d by upstream's pair) and unpublished %d times, want no publish since and no unpublish", when, pv, p, pubs[pv], u)
			}
		}
	}
	statusLists := func(out string, want ...string) {
		t.Helper()
		var attached []string
		for _, l := range tableLines(out)[1:] {
			if f := strings.Fields(l); len(f) > 4 && f[4] == "attached" {
				attached = append(attached, f[3])
			}
		}
		slices.Sort(attached)
		if !slices.Equal(attached, want) {
			t.Errorf("kubectl latch status lists %q attached, want %q:\n%s", attached, want, out)
		}
	}
	// refused: latch-local refuses command, with an error naming why.
	refused := func(command []string, want string) {
		t.Helper()
		var out bytes.Buffer
		err := Control(ctx, env.Client, command, &out)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("latch-local %s: %v, want it refused with %q", strings.Join(command, " "), err, want)
		}
	}

	type step struct {
		command string
		after   func(out string)
	}
	walk := []step{
		{"bin/latch-local up --upstream", nil},
		{"export KUBECONFIG=$PWD/latch-local.kubeconfig", nil},
		{"export PATH=$PWD/bin:$PATH", nil},
		{"kubectl apply -f examples/statefulset.yaml", nil},
		{"kubectl rollout status statefulset/web --timeout=2m", func(string) {
			for _, pv := range webs {
				testsupport.Eventually(t, ctx, 2*time.Minute, pv+" attached", func(context.Context) (bool, error) {
					va, ok := vaOf(pv)
					return ok && va.Status.Attached, nil
				})
				va, _ := vaOf(pv)
				uids[pv] = va.UID
				if pubs[pv] = publishes(env, "ControllerPublishVolume", pv); pubs[pv] < 1 {
					t.Errorf("%s attached without a ControllerPublishVolume", pv)
				}
				if _, latch := va.Annotations[decide.AnnVolumeHandle]; latch {
					t.Errorf("%s's VolumeAttachment carries %s before latch's csi-attacher runs", pv, decide.AnnVolumeHandle)
				}
			}
			kept("attached by upstream's pair")
			upstreamHolder = lease(DriverNamespace, attacherLease)
			if upstreamHolder == "" {
				t.Errorf("Lease %s/%s has no holder while external-attacher attaches", DriverNamespace, attacherLease)
			}
		}},
		{"kubectl latch status", func(out string) { statusLists(out, webs...) }},
		{"sed 's/NAMESPACE/default/g; s/SERVICEACCOUNT/csi-attacher/g; s/DRIVER/mock-csi-latch-dev/g' latch-attacher-rbac.yaml | kubectl apply -f -", nil},
		{"latch-local start csi-attacher", nil},
		{"latch-local stop external-attacher", func(string) {
			testsupport.Eventually(t, ctx, time.Minute, "latch's csi-attacher holding Lease "+attacherLease, func(context.Context) (bool, error) {
				latchHolder = lease(DriverNamespace, attacherLease)
				return latchHolder != "" && latchHolder != upstreamHolder, nil
			})
			refused([]string{"start", AttachDetachController}, "kube-controller-manager runs its attach/detach controller")
		}},
		{"latch-local restart kube-controller-manager --controllers='*,-attachdetach'", nil},
		{"kubectl apply -k deploy/attachdetach-controller", nil},
		{"latch-local start attachdetach-controller", func(string) {
			testsupport.Eventually(t, ctx, time.Minute, "latch's controller holding Lease kube-system/latch-attachdetach-controller", func(context.Context) (bool, error) {
				return lease("kube-system", "latch-attachdetach-controller") != "", nil
			})
			refused([]string{"restart", KubeControllerManager, "--controllers=*"}, "stop it first")
			kept("after both swaps")
		}},
		{"kubectl -n kube-system get configmap latch-local-control -o jsonpath='{.data.components}'", nil},
		{"kubectl apply -f examples/pv-pvc.yaml -f examples/pod.yaml", nil},
		{"kubectl wait --for=condition=Ready pod/app-1 --timeout=2m", func(string) {
			va, ok := vaOf("example-volume")
			if !ok || !va.Status.Attached || va.Spec.NodeName != "node-1" {
				t.Fatalf("example-volume's VolumeAttachment with app-1 Ready: %+v, want attached to node-1", va)
			}
			if va.Annotations[decide.AnnVolumeHandle] != "example-volume" {
				t.Errorf("example-volume's VolumeAttachment has annotations %v, want latch's csi-attacher's %s", va.Annotations, decide.AnnVolumeHandle)
			}
			if n := publishes(env, "ControllerPublishVolume", "example-volume"); n != 1 {
				t.Errorf("example-volume published %d times, want once", n)
			}
		}},
		{"kubectl delete pod app-1", func(string) {
			testsupport.Eventually(t, ctx, 2*time.Minute, "example-volume detached by latch's pair", func(context.Context) (bool, error) {
				_, ok := vaOf("example-volume")
				return !ok && publishes(env, "ControllerUnpublishVolume", "example-volume") == 1, nil
			})
		}},
		{"kubectl latch status", func(out string) {
			statusLists(out, webs...)
			kept("after a Pod attached and detached by latch's pair")
			// The RBAC block as the section applies it gives latch's
			// csi-attacher its orphan record: no warning on its Lease.
			evs, err := env.Client.CoreV1().Events(DriverNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Lease,involvedObject.name=" + attacherLease})
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs.Items {
				if ev.Reason == attacher.EventOrphanRecordFailed {
					t.Errorf("Warning %s on Lease %s/%s after the section's RBAC step: %s", ev.Reason, DriverNamespace, attacherLease, ev.Message)
				}
			}
		}},
		{"latch-local start external-attacher", nil},
		{"latch-local stop csi-attacher", func(string) {
			testsupport.Eventually(t, ctx, time.Minute, "external-attacher holding Lease "+attacherLease+" again", func(context.Context) (bool, error) {
				h := lease(DriverNamespace, attacherLease)
				return h != "" && h != latchHolder, nil
			})
		}},
		{"latch-local stop attachdetach-controller", nil},
		{"latch-local restart kube-controller-manager --controllers='*'", func(string) { kept("after switching back") }},
		{"kubectl delete -f examples/statefulset.yaml", func(string) {
			testsupport.Eventually(t, ctx, 2*time.Minute, "the StatefulSet's volumes detached by upstream's pair", func(context.Context) (bool, error) {
				for _, pv := range webs {
					if _, ok := vaOf(pv); ok || publishes(env, "ControllerUnpublishVolume", pv) != 1 {
						return false, nil
					}
				}
				return true, nil
			})
			for _, pv := range webs {
				if got := env.Driver.Published(pv); len(got) != 0 {
					t.Errorf("%s still published to %v", pv, got)
				}
			}
		}},
	}

	var docs []string
	for _, s := range steps {
		docs = append(docs, s.commands...)
	}
	var walked []string
	for _, s := range walk {
		walked = append(walked, s.command)
	}
	if !slices.Equal(docs, walked) {
		t.Fatalf("docs/migration.md's %q runs\n  %s\nthe test walks\n  %s\n(change the doc and the test together)", migrationSection, strings.Join(docs, "\n  "), strings.Join(walked, "\n  "))
	}

	i := 0
	for _, s := range steps {
		var printed strings.Builder
		for range s.commands {
			w := walk[i]
			i++
			var out string
			if w.command == "bin/latch-local up --upstream" {
				ctx, env = startEnv(t, 12*time.Minute, Options{
					Nodes: 2, RealNodes: true, Upstream: true, ProcessOutput: logs,
					Kubeconfig: filepath.Join(sh.dir, "latch-local.kubeconfig"),
				})
				sh.ctx = ctx
				attacherLease = kube.LeaseName(env.Opts.Driver)
			} else {
				out = sh.run(w.command)
			}
			printed.WriteString(out)
			if w.after != nil {
				w.after(out)
			}
			if t.Failed() {
				t.Fatalf("stopped after `%s`", w.command)
			}
		}
		if s.output != nil {
			checkOutput(t, s.commands, s.output, printed.String())
		}
	}
	if v := env.Driver.Stats().Publish.SingleNodeConflictAttemptsTotal; v != 0 {
		t.Errorf("the driver saw %d publishes of a single-node volume to a second node", v)
	}
}

// env0Driver is latch-local's default driver, whose attacher Lease the
// section names.
const env0Driver = "mock.csi.latch.dev"
