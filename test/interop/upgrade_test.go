//go:build upgrade

package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The upgrade test (make upgrade-test, docs/upgrade.md) replaces an older
// build of latch, built from this checkout's git history
// (testsupport.BinaryAt), by the build of the checkout and back, one
// binary at a time, as a rolling update does: with leader election on and
// volumes attaching and detaching. It needs the git history (a shallow CI
// clone may lack the revision), hence the build constraint: make test
// does not build it.

// upgradeFromEnv names the git revision of the older latch
// (make upgrade-test UPGRADE_FROM=<rev>).
const upgradeFromEnv = "LATCH_UPGRADE_FROM"

// latchBuild is one build of latch's two binaries.
type latchBuild struct {
	name                 string // "old <rev>" or "new"
	attacher, controller string
}

// upgradeBuilds builds the older latch (LATCH_UPGRADE_FROM) and the
// checkout's.
func upgradeBuilds(t *testing.T) (old, cur latchBuild) {
	t.Helper()
	rev := os.Getenv(upgradeFromEnv)
	if rev == "" {
		t.Fatalf("%s is empty: set it to the git revision of the older latch to upgrade from (make upgrade-test UPGRADE_FROM=<rev>; the Makefile's default is 0c7ab01, v0.1.0)", upgradeFromEnv)
	}
	commit, err := testsupport.ResolveRevision(rev)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("building latch as of %s (%s) and as checked out", rev, commit)
	old = latchBuild{
		name:       "old-" + commit[:7],
		attacher:   testsupport.MustBinaryAt(t, commit, "cmd/csi-attacher"),
		controller: testsupport.MustBinaryAt(t, commit, "cmd/attachdetach-controller"),
	}
	cur = latchBuild{
		name:       "new",
		attacher:   testsupport.MustBinary(t, "cmd/csi-attacher"),
		controller: testsupport.MustBinary(t, "cmd/attachdetach-controller"),
	}
	return old, cur
}

// newUpgradeWorld is a control plane with the two nodes of worldNodes
// (kubelet stand-in) and the mock driver, and no attacher or controller.
func newUpgradeWorld(t *testing.T, ctx context.Context) *world {
	t.Helper()
	var nodes []localcluster.NodeConfig
	for _, n := range worldNodes {
		nodes = append(nodes, localcluster.NodeConfig{Name: n})
	}
	w := startWorld(t, ctx, pair{latchAD, latchAt}, stack.Options{Driver: driver, Attacher: stack.AttacherNone, NoController: true, Nodes: nodes})
	var err error
	if w.drv, err = stack.MockDriver(ctx, driver, w.socket, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.drv.Stop)
	return w
}

// startBuildAttacher starts b's csi-attacher with the swap tests' flags
// (leader election on), which every latch build accepts.
func (w *world) startBuildAttacher(b latchBuild) *peer {
	w.t.Helper()
	w.seq++
	name := fmt.Sprintf("csi-attacher-%s-%d", b.name, w.seq)
	endpoint := testsupport.FreeAddr(w.t)
	args := stack.UpstreamAttacherArgs(w.attacherConfig(name, endpoint, swapAttacherArgs))
	return w.startBinary(name, b.attacher, endpoint, args)
}

// startBuildController starts b's attachdetach-controller with leader
// election on and the flags startController passes.
func (w *world) startBuildController(b latchBuild) *peer {
	w.t.Helper()
	w.seq++
	name := fmt.Sprintf("attachdetach-controller-%s-%d", b.name, w.seq)
	endpoint := testsupport.FreeAddr(w.t)
	args := []string{
		"--kubeconfig=" + w.kcfg, "--v=2", "--http-endpoint=" + endpoint, "--leader-elect=true",
		"--max-wait-for-unmount=" + maxWaitForUnmount.String(),
	}
	return w.startBinary(name, b.controller, endpoint, args)
}

// swapBuildAttacher is a rolling update of csi-attacher: to's starts as a
// standby, the running one stops in the middle of a publish, to's takes
// the Lease. It returns when the old one had stopped and the names of
// its work queues.
func (w *world) swapBuildAttacher(to latchBuild) (stopped time.Time, queues []string) {
	w.t.Helper()
	before, _ := w.lease("default", leaseName)
	next := w.startBuildAttacher(to)
	w.eventually("a ControllerPublishVolume in progress", func(context.Context) (bool, error) {
		for _, c := range w.drv.CallsTo("ControllerPublishVolume") {
			if !c.Done() {
				return true, nil
			}
		}
		return false, nil
	})
	queues = w.queueNames(w.attacher)
	w.stop(w.attacher)
	stopped = time.Now()
	w.attacher = next
	after := w.waitLease("default", leaseName, "handed over to "+next.name, handedOver(before))
	w.t.Logf("csi-attacher Lease %s → %s", before, after)
	return stopped, queues
}

// queueNames are the name labels of p's workqueue_adds_total.
func (w *world) queueNames(p *peer) []string {
	w.t.Helper()
	s, err := p.Scrape(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var names []string
	for _, x := range s.Find("workqueue_adds_total", nil) {
		if !slices.Contains(names, x.Labels["name"]) {
			names = append(names, x.Labels["name"])
		}
	}
	slices.Sort(names)
	return names
}

// checkQueueNames fails the test when the two builds' work queue names
// (the name label of the workqueue_* metrics, the controller key of the log
// lines) differ and docs/upgrade.md does not name every one that differs:
// dashboards and log queries on them see nothing after the swap.
func checkQueueNames(t *testing.T, from string, fromQueues []string, to string, toQueues []string) {
	t.Helper()
	if len(fromQueues) == 0 || len(toQueues) == 0 {
		t.Errorf("csi-attacher work queues: %s has %v, %s has %v; want some in both", from, fromQueues, to, toQueues)
		return
	}
	if slices.Equal(fromQueues, toQueues) {
		return
	}
	t.Logf("csi-attacher work queues: %s %v, %s %v", from, fromQueues, to, toQueues)
	doc := upgradeDoc(t)
	for _, q := range append(slices.Clone(fromQueues), toQueues...) {
		if !slices.Contains(fromQueues, q) || !slices.Contains(toQueues, q) {
			if !strings.Contains(doc, `"`+q+`"`) {
				t.Errorf("csi-attacher's work queue %q is in only one of %s and %s and not in docs/upgrade.md", q, from, to)
			}
		}
	}
}

// upgradeDoc is docs/upgrade.md.
func upgradeDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "upgrade.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// swapBuildController is the same for attachdetach-controller.
func (w *world) swapBuildController(to latchBuild) {
	w.t.Helper()
	before, _ := w.lease("kube-system", latchADLease)
	next := w.startBuildController(to)
	w.stop(w.ctrl)
	w.ctrl = next
	after := w.waitLease("kube-system", latchADLease, "handed over to "+next.name, handedOver(before))
	w.t.Logf("attachdetach-controller Lease %s → %s", before, after)
}

// TestUpgrade_latchOldToNewAndBack runs the older build of both binaries
// (LATCH_UPGRADE_FROM) with leader election and volumes attached, then
// upgrades csi-attacher and attachdetach-controller to the checkout's
// build one after the other, and rolls both back (controller first, the
// reverse order), each swap a rolling update while attaches and detaches
// are in flight (csi-attacher stopped in the middle of a publish, with an
// orphaned publication recorded that the next one must undo). After every
// swap: no volume a Pod still wants was detached or unpublished, its
// VolumeAttachment kept its UID, no attached volume was published again,
// everything in flight settled, the Lease changed hands, the orphan was
// undone by the build that took over, and new Pods attach. What the two
// builds disagree on (flags, work queue names) must be in docs/upgrade.md.
func TestUpgrade_latchOldToNewAndBack(t *testing.T) {
	old, cur := upgradeBuilds(t)
	checkFlagCompatibility(t, old, cur)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	w := newUpgradeWorld(t, ctx)
	w.attacher = w.startBuildAttacher(old)
	w.ctrl = w.startBuildController(old)
	w.waitLease("default", leaseName, "held by "+w.attacher.name, held)
	w.waitLease("kube-system", latchADLease, "held by "+w.ctrl.name, held)
	l := newWorkload(w, "upgrade")
	l.add(4)
	l.settled(nil, true)

	steps := []struct {
		what       string
		to         latchBuild
		controller bool
	}{
		{"upgrade csi-attacher", cur, false},
		{"upgrade attachdetach-controller", cur, true},
		{"roll back attachdetach-controller", old, true},
		{"roll back csi-attacher", old, false},
	}
	for _, s := range steps {
		t.Logf("%s to %s, attaches and detaches in flight", s.what, s.to.name)
		var orphan upgradeOrphan
		if !s.controller {
			orphan = l.recordOrphan()
		}
		gone, stop := l.inFlight()
		var stopped time.Time
		var queues []string
		from := w.attacher.name
		if s.controller {
			w.swapBuildController(s.to)
		} else {
			stopped, queues = w.swapBuildAttacher(s.to)
		}
		stop()
		l.settled(gone, false)
		if !s.controller {
			w.orphanUndone(orphan, stopped, w.attacher.name)
			checkQueueNames(t, from, queues, w.attacher.name, w.queueNames(w.attacher))
		}
		// The new leader works: new Pods attach, each published once.
		l.add(2)
		l.settled(nil, true)
		if s.controller && s.to == cur {
			// The older build writes as the same field manager: the new
			// controller must not take it for another attach/detach
			// controller (docs/attachdetach-controller.md).
			if v, err := competing(ctx, w.ctrl); err != nil || v != 0 {
				t.Errorf("%s reports a competing attach/detach controller after the upgrade: %v %v", w.ctrl.name, v, err)
			}
		}
	}
	l.checkPVFinalizers()
	l.drain()
	l.checkPVFinalizersGone()
}

// checkFlagCompatibility compares the flags of the two builds: the
// checkout's accepts every flag of the older one, and each flag only the
// checkout's has is named in docs/upgrade.md (a rollback with it in the
// manifest fails) and makes the older build exit with an error naming it.
func checkFlagCompatibility(t *testing.T, old, cur latchBuild) {
	t.Helper()
	doc := upgradeDoc(t)
	for _, c := range []struct{ cmd, old, cur string }{
		{"csi-attacher", old.attacher, cur.attacher},
		{"attachdetach-controller", old.controller, cur.controller},
	} {
		oldFlags, curFlags := flagNames(t, c.old), flagNames(t, c.cur)
		for _, f := range oldFlags {
			if !slices.Contains(curFlags, f) {
				t.Errorf("%s of %s has --%s, the checkout's has not: an upgrade with it in the manifest fails", c.cmd, old.name, f)
			}
		}
		for _, f := range curFlags {
			if slices.Contains(oldFlags, f) {
				continue
			}
			if !strings.Contains(doc, "`--"+f) {
				t.Errorf("%s's --%s is new since %s and not in docs/upgrade.md's rollback section", c.cmd, f, old.name)
			}
			code, out := exitCode(t, c.old, "--"+f+"="+flagSample(t, c.cur, f))
			if code == 0 || !strings.Contains(out, f) {
				t.Errorf("%s of %s with --%s: exit code %d, output %q; want it to refuse the flag by name", c.cmd, old.name, f, code, firstLine(out))
			} else {
				t.Logf("%s of %s refuses --%s (exit code %d): %s", c.cmd, old.name, f, code, lastLine(out))
			}
		}
	}
}

// flagNames are the flags bin's --help lists.
func flagNames(t *testing.T, bin string) []string {
	t.Helper()
	out, _ := exec.Command(bin, "--help").CombinedOutput() // exits 0 or 2
	flags, _ := parseFlagHelp(string(out))
	if len(flags) == 0 {
		t.Fatalf("%s --help lists no flags: %s", bin, out)
	}
	var names []string
	for _, f := range flags {
		names = append(names, f.name)
	}
	return names
}

// flagSample is a value bin accepts for flag f: its default.
func flagSample(t *testing.T, bin, f string) string {
	t.Helper()
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	flags, _ := parseFlagHelp(string(out))
	for _, fl := range flags {
		if fl.name == f && fl.hasDef {
			return fl.def
		}
		if fl.name == f && fl.typ == "" {
			return strconv.FormatBool(true)
		}
	}
	t.Fatalf("%s --help shows no default for --%s", bin, f)
	return ""
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
