package bench

import (
	"fmt"
	"strings"

	"github.com/latchcsi/latch/internal/testsupport"
)

// PeerContenderOptions choose bench-peers' contenders.
type PeerContenderOptions struct {
	// LatchAttacher and LatchController are this checkout's csi-attacher
	// and attachdetach-controller binaries (BuildComponents).
	LatchAttacher, LatchController string
	// Previous is the git revision of latch's previous release (empty: no
	// previous release), built with testsupport.BinaryAt; PreviousName
	// names it in the report ("latch v0.1.0").
	Previous, PreviousName string
	// Upstream adds external-attacher v4.13 tuned (100 workers, client
	// limits 2000/2000) and at 10 workers (same client limits);
	// KCM adds kube-controller-manager v1.37.2 running only its
	// attachdetach controller.
	Upstream, KCM bool
	// FixedLatency runs latch fixed in the paced and saturated workloads
	// too (by default it runs the backend profiles only): the comparison
	// of the fixed limit with an earlier build that had one.
	FixedLatency bool
}

// The upstream external-attacher's flags of each upstream contender
// (external-attacher v4.13: --worker-threads, and csi-lib-utils'
// standard flags --kube-api-qps and --kube-api-burst, defaults 10, 5 and
// 10). Both get the same client limits, so the worker count is all that
// differs between them: at upstream's default of 5 QPS the client's rate
// limiter, not the workers, would set the pace (docs/performance.md).
var (
	UpstreamTunedArgs = []string{"--worker-threads=100", "--kube-api-qps=2000", "--kube-api-burst=2000"}
	Upstream10Args    = []string{"--worker-threads=10", "--kube-api-qps=2000", "--kube-api-burst=2000"}
	// KCMArgs raise kube-controller-manager's client limits (default 20
	// QPS, 30 burst) as latch-scale does, so that they are not what is
	// measured.
	KCMArgs = []string{"--kube-api-qps=1000", "--kube-api-burst=2000"}
)

// PeerContenders builds (or finds) every contender's binary. A previous
// release that cannot be built from the git history (a shallow clone, an
// unknown revision) is skipped with the reason in skipped; any other
// build failure is an error. latch's csi-attacher runs twice: with its
// default adaptive driver concurrency (the reference of the ratios, on
// every workload) and with --driver-concurrency=fixed (backend profiles
// only, like upstream at 10 workers, unless o.FixedLatency).
func PeerContenders(o PeerContenderOptions) (attachers []PeerAttacher, controllers []PeerController, skipped []string, err error) {
	attachers = append(attachers,
		PeerAttacher{Name: PeerLatchAdaptive, Binary: o.LatchAttacher, Latch: true, Latency: true, Backends: true},
		PeerAttacher{Name: PeerLatchFixed, Binary: o.LatchAttacher, Args: LatchFixedArgs, Latch: true, Backends: true, Latency: o.FixedLatency})
	controllers = append(controllers, PeerController{Name: PeerLatchController, Binary: o.LatchController, Latch: true})
	if o.Previous != "" {
		name := o.PreviousName
		if name == "" {
			name = "latch " + o.Previous
		}
		att, aerr := testsupport.BinaryAt(o.Previous, "cmd/csi-attacher")
		ctrl, cerr := testsupport.BinaryAt(o.Previous, "cmd/attachdetach-controller")
		if aerr == nil && cerr == nil {
			attachers = append(attachers, PeerAttacher{Name: name, Binary: att, Latch: true, Previous: true, Latency: true})
			controllers = append(controllers, PeerController{Name: name, Binary: ctrl, Latch: true, Previous: true})
		} else {
			skipped = append(skipped, fmt.Sprintf("%s (git revision %s): cannot be built from this checkout's history: %v", name, o.Previous, firstErr(aerr, cerr)))
		}
	}
	if o.Upstream {
		bin, err := testsupport.UpstreamBinary("external-attacher")
		if err != nil {
			return nil, nil, nil, err
		}
		attachers = append(attachers,
			PeerAttacher{Name: "upstream tuned", Binary: bin, Args: UpstreamTunedArgs, Latency: true, Backends: true},
			PeerAttacher{Name: "upstream 10", Binary: bin, Args: Upstream10Args, Backends: true})
	}
	if o.KCM {
		bin, err := testsupport.UpstreamBinary("kube-controller-manager")
		if err != nil {
			return nil, nil, nil, err
		}
		controllers = append(controllers, PeerController{Name: "kube-controller-manager", Binary: bin, KCM: true, Args: KCMArgs})
	}
	return attachers, controllers, skipped, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// PeerWorkloads keeps of the contenders the workloads named (latency,
// backends, controllers): an attacher keeps the workloads of it that are
// named, and is left out when none is; the controllers are left out
// unless controllers is named.
func PeerWorkloads(attachers []PeerAttacher, controllers []PeerController, workloads []string) ([]PeerAttacher, []PeerController) {
	named := map[string]bool{}
	for _, w := range workloads {
		named[strings.TrimSpace(w)] = true
	}
	var kept []PeerAttacher
	for _, a := range attachers {
		a.Latency = a.Latency && named["latency"]
		a.Backends = a.Backends && named["backends"]
		if a.Latency || a.Backends {
			kept = append(kept, a)
		}
	}
	if !named["controllers"] {
		controllers = nil
	}
	return kept, controllers
}
