package reliability_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
)

// chaosSize is how big and how long a chaos run is.
type chaosSize struct {
	volumes, nodes int
	duration       time.Duration
	// tick is the pause between two random actions.
	tick time.Duration
}

// The short run is part of the normal test suite; LATCH_SOAK=1 (make soak)
// runs the long one.
var (
	chaosShort = chaosSize{volumes: 40, nodes: 4, duration: 40 * time.Second, tick: 50 * time.Millisecond}
	chaosSoak  = chaosSize{volumes: 200, nodes: 8, duration: 6 * time.Minute, tick: 40 * time.Millisecond}
)

// pickChaosSize is soak under LATCH_SOAK (make soak), else short.
func pickChaosSize(short, soak chaosSize) chaosSize {
	if os.Getenv("LATCH_SOAK") != "" {
		return soak
	}
	return short
}

// chaosSeed is LATCH_CHAOS_SEED when set, else a fresh seed; either way it
// is printed, as run's seed, to the test log and to stderr so a failing
// run can be replayed.
func chaosSeed(t *testing.T, run string) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LATCH_CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("LATCH_CHAOS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("%s seed %d (replay with LATCH_CHAOS_SEED=%d)", run, seed, seed)
	fmt.Fprintf(os.Stderr, "%s seed %d\n", run, seed)
	return seed
}

// chaosLogger is the controllers' logger of a chaos run: nil (klog's
// global logger) unless LATCH_CHAOS_LOG names a directory, where both
// controllers then log at -v=LATCH_CHAOS_V (default 4: every key's
// decision) to chaos-<seed>.log, to read what led to a failure.
func chaosLogger(t *testing.T, seed uint64) *klog.Logger {
	dir := os.Getenv("LATCH_CHAOS_LOG")
	if dir == "" {
		return nil
	}
	v := 4
	if s := os.Getenv("LATCH_CHAOS_V"); s != "" {
		var err error
		if v, err = strconv.Atoi(s); err != nil {
			t.Fatalf("LATCH_CHAOS_V=%q: %v", s, err)
		}
	}
	path := filepath.Join(dir, fmt.Sprintf("chaos-%d.log", seed))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the env's cleanup (registered later, run earlier) has
	// stopped the controllers. An *os.File takes concurrent writes whole.
	t.Cleanup(func() { _ = f.Close() })
	t.Logf("controller logs at -v=%d in %s", v, path)
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v), textlogger.Output(f)))
	return &logger
}

// chaos is one run's bookkeeping.
type chaos struct {
	e      *env
	rng    *rand.Rand
	nodes  []string
	pvs    []string
	pods   []string // live Pod names
	nextID int
	// faults counts what was injected, by kind.
	faults     map[string]int
	podsMade   int
	podsKilled int
	actionErrs int
	lastAPI    time.Time
	sick       map[string]time.Time // NotReady nodes → when they recover
}

func TestChaos_seededRandomFaults_invariantsHold(t *testing.T) {
	size := pickChaosSize(chaosShort, chaosSoak)
	seed := chaosSeed(t, "chaos")
	start := time.Now()

	e := newEnv(t, options{ctrl: controller.Config{Workers: 8, MaxWaitForUnmount: 3 * time.Second}, logger: chaosLogger(t, seed)})
	c := &chaos{e: e, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), faults: map[string]int{}, sick: map[string]time.Time{}}
	for i := range size.nodes {
		c.nodes = append(c.nodes, e.addNode(fmt.Sprintf("n%d", i)))
	}
	for i := range size.volumes {
		c.pvs = append(c.pvs, e.volume(fmt.Sprintf("v%d", i)))
	}
	// One volume in eight is also named by a ReadWriteMany PV: Pods of
	// either PV ask for the same unique volume, which must stay on one
	// node while the ReadWriteOnce PV has it (invariant 3 is judged per
	// volume handle).
	for i := range size.volumes / 8 {
		c.pvs = append(c.pvs, e.aliasVolume(fmt.Sprintf("v%d-rwx", i), c.pvs[i]))
	}

	deadline := time.Now().Add(size.duration)
	for time.Now().Before(deadline) && e.ctx.Err() == nil {
		c.step()
		time.Sleep(size.tick)
	}
	chaosEnd := time.Now()

	// Calm: no new faults, every node healthy; the controllers must bring
	// the world to rest on their own.
	e.mock.ClearFaults()
	for n := range c.sick {
		if err := e.kubelet.SetReady(e.ctx, n, true); err != nil {
			t.Fatal(err)
		}
	}
	checks := e.checkInvariants(3 * time.Minute)
	e.teardownClean()
	checks += e.checkInvariants(time.Minute)

	stats := e.mock.Stats()
	var kinds []string
	total := 0
	for k, n := range c.faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	var repeats []string
	for k, n := range e.repeats {
		repeats = append(repeats, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(repeats)
	publishes := stats.Methods["ControllerPublishVolume"]
	unpublishes := stats.Methods["ControllerUnpublishVolume"]
	summary := fmt.Sprintf("chaos summary: seed=%d nodes=%d volumes=%d pods created=%d deleted=%d "+
		"objects=%d (PVs+PVCs+Pods+VolumeAttachments attached) publishes ok=%d of %d unpublishes ok=%d of %d "+
		"faults injected=%d [%s] repeated publishes accepted=[%s] invariant checks=%d chaos phase=%s total=%s action errors=%d",
		seed, size.nodes, size.volumes, c.podsMade, c.podsKilled,
		2*size.volumes+c.podsMade+int(publishes.ByCode["OK"]), publishes.ByCode["OK"], publishes.Calls, unpublishes.ByCode["OK"], unpublishes.Calls,
		total, strings.Join(kinds, " "), strings.Join(repeats, " "), checks,
		chaosEnd.Sub(start).Round(time.Second), time.Since(start).Round(time.Second), c.actionErrs)
	t.Log(summary)
	fmt.Fprintln(os.Stderr, summary)
}

// step takes one random action: mostly workload (Pods come and go, some
// asking for a volume another node holds), sometimes a fault.
func (c *chaos) step() {
	e := c.e
	now := time.Now()
	for n, until := range c.sick {
		if now.After(until) {
			c.try(e.kubelet.SetReady(e.ctx, n, true))
			delete(c.sick, n)
		}
	}
	switch r := c.rng.IntN(100); {
	case r < 45:
		c.createPod()
	case r < 80:
		c.deletePod()
	case r < 88:
		c.driverRule()
	case r < 91:
		c.faults["driver crash"]++
		keep := c.rng.IntN(2) == 0
		end := e.disrupt("driver crashed")
		c.try(e.mock.Crash(keep))
		time.Sleep(time.Duration(100+c.rng.IntN(600)) * time.Millisecond)
		c.try(e.mock.Restart())
		end()
	case r < 92:
		c.faults["attach/detach controller killed"]++
		e.killController()
	case r < 93:
		c.faults["csi-attacher killed"]++
		e.killAttacher()
	case r < 95:
		// The API server restart is the slowest fault; space them out.
		if now.Sub(c.lastAPI) < 10*time.Second {
			return
		}
		c.lastAPI = now
		c.faults["API server restarted"]++
		end := e.disrupt("API server restarted")
		c.try(cluster.RestartAPIServer(e.ctx))
		end()
	case r < 97:
		n := c.nodes[c.rng.IntN(len(c.nodes))]
		if _, ok := c.sick[n]; ok {
			return
		}
		c.faults["node NotReady"]++
		c.try(e.kubelet.SetReady(e.ctx, n, false))
		c.sick[n] = now.Add(time.Duration(1+c.rng.IntN(5)) * time.Second)
	default:
		c.faults["concurrent VolumeAttachment write"]++
		vas := e.vas()
		if len(vas) == 0 {
			return
		}
		va := vas[c.rng.IntN(len(vas))]
		// Not a disruption: no repeated publish is allowed for it.
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"example.com/chaos":%q}}}`, strconv.Itoa(c.nextID))
		_, err := e.client.StorageV1().VolumeAttachments().Patch(e.ctx, va.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		c.try(err)
	}
}

func (c *chaos) try(err error) {
	if err != nil {
		c.actionErrs++
		c.e.t.Logf("chaos action failed (expected while the API server restarts): %v", err)
	}
}

func (c *chaos) createPod() {
	e := c.e
	c.nextID++
	name := fmt.Sprintf("p%d", c.nextID)
	pv := c.pvs[c.rng.IntN(len(c.pvs))]
	node := c.nodes[c.rng.IntN(len(c.nodes))]
	_, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, localcluster.NewPod(e.ns, name, node, pv), metav1.CreateOptions{})
	c.try(err)
	if err == nil {
		c.pods = append(c.pods, name)
		c.podsMade++
	}
}

func (c *chaos) deletePod() {
	if len(c.pods) == 0 {
		return
	}
	e := c.e
	i := c.rng.IntN(len(c.pods))
	name := c.pods[i]
	err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{})
	c.try(err)
	if err == nil {
		c.pods = slices.Delete(c.pods, i, i+1)
		c.podsKilled++
	}
}

// driverRule installs a short-lived driver fault: a transient or final
// error code, a hang past the attacher's timeout, or a lost reply.
func (c *chaos) driverRule() {
	methods := []string{"ControllerPublishVolume", "ControllerUnpublishVolume", "ListVolumes"}
	r := csimock.Rule{Method: methods[c.rng.IntN(len(methods))], Times: int64(1 + c.rng.IntN(3))}
	switch k := c.rng.IntN(7); {
	case k < 4:
		all := append(slices.Clone(transientCodes), codes.Internal)
		r.Code = all[c.rng.IntN(len(all))]
		r.Message = "chaos"
		c.faults["driver "+r.Code.String()]++
	case k < 5:
		// A message longer than the API allows in attachError and
		// detachError: the controllers must still show it (invariant 1
		// and 6).
		r.Code, r.Message = codes.Internal, "chaos: "+strings.Repeat("a driver that says too much ", 200)
		c.faults["driver long message"]++
	case k < 6:
		r.Hang, r.Times = true, 1
		c.faults["driver hang"]++
	default:
		r.Phase, r.Code, r.Times = csimock.PhaseAfter, codes.DeadlineExceeded, 1
		c.faults["driver lost reply"]++
	}
	if _, err := c.e.mock.AddFault(r); err != nil {
		c.e.t.Fatal(err)
	}
}
