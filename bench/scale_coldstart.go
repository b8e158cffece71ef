package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The volumes created at start, past the pre-attached ones.
const (
	startAttacherVA        = iota // a VolumeAttachment the harness creates for the cold attacher
	startAttacherLimitedVA        // the same for the cold attacher with a container's memory limit
	startLatchPod                 // a Pod created when latch's controller starts
	startKCMPod                   // a Pod created when kube-controller-manager starts
	startProbeLatch               // the probes that the in-process attacher is ready
	startProbeKCM
	startReserved // the first index the trickle and the bursts hand out
)

// attacherColdStart starts csi-attacher (the binary) with every volume's
// VolumeAttachment attached and one new VolumeAttachment: its ready time is
// when the new one is attached; it must publish nothing else and unpublish
// nothing.
func (e *scaleEnv) attacherColdStart(ctx context.Context) error {
	w := e.w
	i := w.volumes + startAttacherVA
	if err := e.newAttacherVA(ctx, i); err != nil {
		return err
	}
	calls := w.calls()
	before, err := e.writeSnapshot(ctx, nil)
	if err != nil {
		return err
	}
	// The first ListVolumes reconcile runs when the writes window ends, in
	// pages of MaxEntries (measured by listVolumesReconcile).
	p, err := e.startColdAttacher(ctx, i, "csi-attacher.log", nil,
		"--reconcile-sync="+e.sz.WritesWindow.String(), fmt.Sprintf("--max-entries=%d", e.sz.MaxEntries))
	if err != nil {
		return err
	}
	defer p.stop()
	e.rep.Figures["attacher_ready_s"] = round2(time.Since(p.started).Seconds())
	e.restUntil(ctx, p)
	after, err := e.writeSnapshot(ctx, nil)
	if err != nil {
		return err
	}
	if err := e.listVolumesReconcile(ctx, p); err != nil {
		return err
	}
	others, unpublishes := w.callsSince(calls, w.pv(i))
	u := p.usage()
	e.rep.Figures["attacher_peak_rss_mb"] = round2(float64(u.PeakRSSBytes) / (1 << 20))
	e.rep.Figures["attacher_cpu_s_first_window"] = round2(u.CPUSeconds)
	e.rep.Figures["attacher_publishes_at_start"] = others
	e.rep.Figures["attacher_unpublishes_at_start"] = unpublishes
	e.rep.Figures["attacher_writes_first_window"] = after.Sub(before).Total()
	e.rep.Figures["attacher_writes_first_window_by_kind"] = after.Sub(before)
	e.rep.check("csi-attacher: no ControllerPublish for an attached VolumeAttachment", "0", fmt.Sprint(others), others == 0)
	e.rep.check("csi-attacher: no ControllerUnpublish at start", "0", fmt.Sprint(unpublishes), unpublishes == 0)
	return e.checkNothingDetached(ctx, "csi-attacher")
}

// startColdAttacher starts csi-attacher (startAttacherProc) and waits
// until it attached volume i's new VolumeAttachment: its ready time. The
// caller stops it.
func (e *scaleEnv) startColdAttacher(ctx context.Context, i int, logName string, env []string, args ...string) (*scaleProc, error) {
	w := e.w
	p, err := e.startAttacherProc(logName, env, args...)
	if err != nil {
		return nil, err
	}
	err = p.waitUntil(ctx, e.sz.ActionTimeout, "the new VolumeAttachment attached", func(ctx context.Context) bool {
		got, err := e.admin.StorageV1().VolumeAttachments().Get(ctx, w.va(i), metav1.GetOptions{})
		return err == nil && got.Status.Attached
	})
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// startAttacherProc starts csi-attacher (the binary) against the world's
// driver and the API server, with env added to its environment and args
// after its CSI address and kubeconfig.
func (e *scaleEnv) startAttacherProc(logName string, env []string, args ...string) (*scaleProc, error) {
	return startScaleProc("csi-attacher", e.cfg.AttacherBinary, filepath.Join(e.cfg.LogDir, logName), env, nil,
		append([]string{"--csi-address=unix://" + e.w.socket, "--kubeconfig=" + e.cfg.Kubeconfig}, args...)...)
}

// driverCalls counts the mock driver's ControllerPublish and
// ControllerUnpublish calls so far.
type driverCalls struct{ publishes, unpublishes int }

func (w *scaleWorld) calls() driverCalls {
	return driverCalls{len(w.driverMock.CallsTo("ControllerPublishVolume")), len(w.driverMock.CallsTo("ControllerUnpublishVolume"))}
}

// callsSince counts the ControllerPublish calls since before for any
// volume but except ("": for every volume), and every ControllerUnpublish
// since before.
func (w *scaleWorld) callsSince(before driverCalls, except string) (publishes, unpublishes int) {
	for _, c := range w.driverMock.CallsTo("ControllerPublishVolume")[before.publishes:] {
		if c.VolumeID != except {
			publishes++
		}
	}
	return publishes, len(w.driverMock.CallsTo("ControllerUnpublishVolume")) - before.unpublishes
}

// newAttacherVA creates volume i, a VolumeAttachment of it not yet
// attached, and its Pod, so that the controllers started later want it.
func (e *scaleEnv) newAttacherVA(ctx context.Context, i int) error {
	w := e.w
	if err := w.createVolume(ctx, i, false); err != nil {
		return err
	}
	va := newVA(w.va(i), w.driver, w.pv(i), w.node(i))
	if _, err := e.client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
		return err
	}
	return w.createPod(ctx, i)
}

// writeSnapshot is the API server's write counts less the harness's and
// the kubelet stand-in's (and extra's, an in-process attacher), without
// Leases (the API server's own heartbeats).
func (e *scaleEnv) writeSnapshot(ctx context.Context, extra *writeCounter) (Writes, error) {
	all, err := apiWrites(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	out := all.Sub(e.writes.snapshot()).Sub(e.w.kubeletWrites.snapshot())
	if extra != nil {
		out = out.Sub(extra.snapshot())
	}
	for k := range out {
		// The API server's own: its Lease heartbeat and the kubernetes
		// Service's endpoints reconciler.
		if strings.HasSuffix(k, " leases") || strings.HasSuffix(k, " endpoints") {
			delete(out, k)
		}
	}
	return out, nil
}

// restUntil waits until the writes window since p's start has passed.
func (e *scaleEnv) restUntil(ctx context.Context, p *scaleProc) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(p.started.Add(e.sz.WritesWindow))):
	}
}

// checkNothingDetached checks that every pre-attached volume still has its
// VolumeAttachment, attached and not being deleted, and is still in its
// node's status.volumesAttached: on the node it was created on, or the one
// a recovery burst moved it to.
func (e *scaleEnv) checkNothingDetached(ctx context.Context, who string) error {
	w := e.w
	vas, err := e.admin.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	attached := map[placement]bool{}
	for _, va := range vas.Items {
		if va.Spec.Attacher == w.driver && va.Spec.Source.PersistentVolumeName != nil && va.Status.Attached && va.DeletionTimestamp == nil {
			attached[placement{pv: *va.Spec.Source.PersistentVolumeName, node: va.Spec.NodeName}] = true
		}
	}
	nodes, err := e.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: w.label})
	if err != nil {
		return err
	}
	listed := map[placement]bool{}
	prefix := uniqueNamePrefix(w.driver)
	for _, n := range nodes.Items {
		for _, a := range n.Status.VolumesAttached {
			if pv, ok := strings.CutPrefix(string(a.Name), prefix); ok {
				listed[placement{pv: pv, node: n.Name}] = true
			}
		}
	}
	okVA, okListed := 0, 0
	for i := range w.volumes {
		p := placement{pv: w.pv(i), node: w.node(i)}
		if to, ok := w.moved[i]; ok {
			p.node = to
		}
		if attached[p] {
			okVA++
		}
		if listed[p] {
			okListed++
		}
	}
	e.rep.check(who+": every pre-attached VolumeAttachment attached and not deleted", fmt.Sprint(w.volumes), fmt.Sprint(okVA), okVA == w.volumes)
	e.rep.check(who+": every pre-attached volume still in its node's status.volumesAttached", fmt.Sprint(w.volumes), fmt.Sprint(okListed), okListed == w.volumes)
	return nil
}

// controllerColdStart starts an attach/detach controller (latch's or
// kube-controller-manager's, prefix "" or "kcm_") with every volume
// attached and a Pod created at start, with an in-process csi-attacher
// attaching what it is asked to.
func (e *scaleEnv) controllerColdStart(ctx context.Context, which string) error {
	w := e.w
	prefix := ""
	if which == "kcm" {
		prefix = "kcm_"
	}
	i, probe := w.volumes+startLatchPod, w.volumes+startProbeLatch
	if which == "kcm" {
		i, probe = w.volumes+startKCMPod, w.volumes+startProbeKCM
	}
	attWrites, stopAtt, err := e.readyInProcessAttacher(ctx, probe)
	if err != nil {
		return err
	}
	defer stopAtt()
	unpublishesBefore := len(w.driverMock.CallsTo("ControllerUnpublishVolume"))
	before, err := e.writeSnapshot(ctx, attWrites)
	if err != nil {
		return err
	}
	var p *scaleProc
	if which == "kcm" {
		p, err = e.startKCM()
	} else {
		p, err = startScaleProc("attachdetach-controller", e.cfg.ControllerBinary, filepath.Join(e.cfg.LogDir, "attachdetach-controller.log"), nil,
			[]milestone{{"synced", "Caches are synced"}, {"rebuilt", "Rebuilt the actual state of the world"}},
			controllerArgs(e.cfg.Kubeconfig, e.cfg.ControllerArgs)...)
	}
	if err != nil {
		return err
	}
	defer p.stop()
	// The Pod created at start: its volume must get attached.
	if err := w.createVolume(ctx, i, false); err != nil {
		return err
	}
	if err := w.createPod(ctx, i); err != nil {
		return err
	}
	err = p.waitUntil(ctx, e.sz.ActionTimeout, "a VolumeAttachment for the Pod created at start", func(ctx context.Context) bool {
		_, err := e.admin.StorageV1().VolumeAttachments().Get(ctx, w.va(i), metav1.GetOptions{})
		return err == nil
	})
	if err != nil {
		return err
	}
	e.rep.Figures[prefix+"controller_first_action_s"] = round2(time.Since(p.started).Seconds())
	err = p.waitUntil(ctx, e.sz.ActionTimeout, "the Pod created at start attached and in its node's status", func(ctx context.Context) bool {
		n, err := e.admin.CoreV1().Nodes().Get(ctx, w.node(i), metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == w.uniqueName(i) })
	})
	if err != nil {
		return err
	}
	e.rep.Figures[prefix+"controller_attached_s"] = round2(time.Since(p.started).Seconds())
	if s, ok := p.since("synced"); ok {
		e.rep.Figures[prefix+"controller_ready_s"] = round2(s)
	} else {
		e.rep.Notes = append(e.rep.Notes, which+": no cache-sync line in the log; "+prefix+"controller_ready_s not measured")
	}
	if s, ok := p.since("rebuilt"); ok {
		e.rep.Figures[prefix+"controller_rebuilt_s"] = round2(s)
	}
	e.restUntil(ctx, p)
	after, err := e.writeSnapshot(ctx, attWrites)
	if err != nil {
		return err
	}
	d := after.Sub(before)
	u := p.usage()
	e.rep.Figures[prefix+"controller_peak_rss_mb"] = round2(float64(u.PeakRSSBytes) / (1 << 20))
	e.rep.Figures[prefix+"controller_cpu_s_first_window"] = round2(u.CPUSeconds)
	e.rep.Figures[prefix+"controller_writes_first_minute"] = d.Total()
	e.rep.Figures[prefix+"controller_writes_first_window_by_kind"] = d
	if err := e.idle(ctx, p, prefix); err != nil {
		return err
	}
	unpublishes := len(w.driverMock.CallsTo("ControllerUnpublishVolume")) - unpublishesBefore
	e.rep.check(which+": no ControllerUnpublish", "0", fmt.Sprint(unpublishes), unpublishes == 0)
	deletes := 0
	for k, v := range d {
		if strings.HasPrefix(k, "DELETE volumeattachments") {
			deletes += v
		}
	}
	e.rep.check(which+": no VolumeAttachment deleted", "0", fmt.Sprint(deletes), deletes == 0)
	if err := e.checkNothingDetached(ctx, which); err != nil {
		return err
	}
	e.progress("%s: cold start, writes window and idle window done", which)
	// Steady state with a trickle, then the recovery burst (it fails nodes
	// for good, so it comes last), with the same controller and attacher.
	aw, err := watchAttachments(ctx, e.admin, w.driver)
	if err != nil {
		return err
	}
	defer aw.close()
	e.progress("%s: watching the attachments", which)
	t := time.Now()
	if err := e.trickle(ctx, p, which, prefix, aw, attWrites); err != nil {
		return fmt.Errorf("trickle: %w", err)
	}
	e.rep.Figures[prefix+"trickle_step_s"] = round2(time.Since(t).Seconds())
	e.progress("%s: trickle done in %.1fs", which, time.Since(t).Seconds())
	t = time.Now()
	if err := e.recoveryBurst(ctx, p, which, prefix, aw); err != nil {
		return fmt.Errorf("recovery burst: %w", err)
	}
	e.rep.Figures[prefix+"recovery_step_s"] = round2(time.Since(t).Seconds())
	e.progress("%s: recovery burst done in %.1fs", which, time.Since(t).Seconds())
	return p.alive()
}

// startKCM starts kube-controller-manager with only its attach/detach
// controller, its client limits raised so that they are not what is
// measured.
func (e *scaleEnv) startKCM() (*scaleProc, error) {
	addr, err := testsupport.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	certs, err := os.MkdirTemp(e.cfg.LogDir, "kcm-certs")
	if err != nil {
		return nil, err
	}
	args := stack.KubeControllerManagerArgs(stack.KubeControllerManagerConfig{
		Kubeconfig: e.cfg.Kubeconfig, SecureAddr: addr, CertDir: certs,
		Args: []string{"--kube-api-qps=1000", "--kube-api-burst=2000"},
	})
	return startScaleProc("kube-controller-manager", e.cfg.KCMBinary, filepath.Join(e.cfg.LogDir, "kube-controller-manager.log"), nil,
		[]milestone{{"started", "Starting attach detach controller"}, {"synced", "Caches are synced"}}, args...)
}

// readyInProcessAttacher runs csi-attacher in this process, its writes
// counted apart, and waits until it attached a probe VolumeAttachment
// (volume probe), so that the controller measured next finds it ready.
func (e *scaleEnv) readyInProcessAttacher(ctx context.Context, probe int) (*writeCounter, func(), error) {
	w := e.w
	counter := newWriteCounter()
	cfg := stack.AttacherConfig(countingConfig(rest.CopyConfig(e.rest), counter, "latch-scale-attacher"), w.socket)
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := stack.Attacher(actx, "csi-attacher", cfg)
	stop := func() { cancel(); _ = c.Stop() }
	if err := w.createVolume(ctx, probe, false); err != nil {
		stop()
		return nil, nil, err
	}
	va := newVA(w.va(probe), w.driver, w.pv(probe), w.node(probe))
	if _, err := e.client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
		stop()
		return nil, nil, err
	}
	if err := w.createPod(ctx, probe); err != nil {
		stop()
		return nil, nil, err
	}
	err := waitFor(ctx, e.sz.ActionTimeout, "the in-process csi-attacher to attach its probe", func() bool {
		got, err := e.admin.StorageV1().VolumeAttachments().Get(ctx, w.va(probe), metav1.GetOptions{})
		return err == nil && got.Status.Attached
	})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return counter, stop, nil
}

// idle measures p's CPU over IdleWindow with nothing changing, and the API
// requests the API server served meanwhile (all verbs, every client: the
// harness and the kubelet stand-in are idle, the in-process csi-attacher
// too unless it resyncs).
func (e *scaleEnv) idle(ctx context.Context, p *scaleProc, prefix string) error {
	from, err := e.mark(ctx, p, nil)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(e.sz.IdleWindow):
	}
	if err := p.alive(); err != nil {
		return err
	}
	to, err := e.mark(ctx, p, nil)
	if err != nil {
		return err
	}
	w := window{from, to}
	gc := w.gc()
	e.rep.Figures[prefix+"controller_idle_cpu_percent"] = w.cpuPercent()
	// The share of the idle CPU that went to Go's collector, from the
	// child's gctrace lines (Go collects at least every two minutes, and
	// each collection marks the whole live heap).
	e.rep.Figures[prefix+"controller_idle_gc_cpu_percent"] = round2(100 * gc.CPUSeconds / w.seconds())
	e.rep.Figures[prefix+"controller_idle_gcs"] = gc.Count
	e.rep.Figures[prefix+"controller_idle_gcs_periodic"] = gc.Periodic
	e.rep.Figures[prefix+"idle_api_requests_per_minute"] = w.requestsPerMinute()
	e.rep.Figures[prefix+"controller_idle_rss_mb"] = round2(float64(to.usage.PeakRSSBytes) / (1 << 20))
	return nil
}

// apiRequests is the sum of the API server's apiserver_request_total.
func apiRequests(ctx context.Context, client kubernetes.Interface) (int, error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the API server's metrics: %w", err)
	}
	samples, err := testsupport.ParseText(raw)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range samples.Find("apiserver_request_total", nil) {
		n += int(s.Value)
	}
	return n, nil
}

// listVolumesReconcile waits for csi-attacher's first ListVolumes
// reconcile (every page of it) and records its wall time, from the first
// page's start to the last page's end in the driver's call log, and the
// attacher's CPU over it (sampled when the first page is seen and after
// the last, so it includes up to 50 ms either side).
func (e *scaleEnv) listVolumesReconcile(ctx context.Context, p *scaleProc) error {
	w := e.w
	// The seeded volumes and the one published at start.
	pages := (w.volumes + 1 + e.sz.MaxEntries - 1) / e.sz.MaxEntries
	var u0 Usage
	err := p.waitUntil(ctx, e.sz.WritesWindow+e.sz.ActionTimeout, "the first ListVolumes page", func(context.Context) bool {
		if len(w.driverMock.CallsTo("ListVolumes")) > 0 {
			u0 = p.usage()
			return true
		}
		return false
	})
	if err != nil {
		return err
	}
	var calls []csimock.Call
	err = p.waitUntil(ctx, e.sz.ActionTimeout, fmt.Sprintf("%d ListVolumes pages", pages), func(context.Context) bool {
		calls = w.driverMock.CallsTo("ListVolumes")
		return len(calls) >= pages && !calls[pages-1].End.IsZero()
	})
	if err != nil {
		return err
	}
	u1 := p.usage()
	wall := calls[pages-1].End.Sub(calls[0].Start)
	// Milliseconds matter here: a few pages take well under 10 ms.
	e.rep.Figures["listvolumes_reconcile_wall_s"] = math.Round(wall.Seconds()*1000) / 1000
	e.rep.Figures["listvolumes_reconcile_cpu_s"] = round2(u1.CPUSeconds - u0.CPUSeconds)
	e.rep.Figures["listvolumes_reconcile_pages"] = pages
	e.rep.Figures["listvolumes_max_entries"] = e.sz.MaxEntries
	return nil
}
