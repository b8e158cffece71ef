package latchlocal

import (
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/stack"
)

// latch-local runs csi-attacher, the attach/detach controller and the API
// server in one process. Each controller binary serves component-base's
// legacy registry, which is process-wide: here it holds the API server's
// metrics and both controllers' workqueue and leader election metrics. So
// each controller's endpoint serves the part of it that the controller's
// binary would serve, by metric family and, for the families every
// component shares, by the queue or Lease name:
//
//   - csi-attacher: csi_sidecar_operations_seconds (its own registry),
//     latch_attacher_*, and workqueue_*, latch_workqueue_* and
//     leader_election_* of its queues and Lease;
//   - attachdetach-controller: its own registry (its metrics and backlog
//     collectors), and workqueue_* and leader_election_* of its queues
//     and Lease;
//   - both: rest_client_*, go_* and process_*, which belong to the whole
//     process (the API server's own loopback clients included).
//
// Everything else in the legacy registry (the API server's) is served by
// neither.

// part is whose a metric is.
type part int

const (
	notServed part = iota
	attacherPart
	controllerPart
	processPart
)

// sharedFamilies are families every component's queues or elector report
// into, told apart by their name label.
var sharedFamilies = []string{"workqueue_", "latch_workqueue_", "leader_election_"}

// owner says whose a sample of the legacy registry is; controllerLease is
// the controller's Lease name.
func owner(family string, labels []*dto.LabelPair, controllerLease string) part {
	switch {
	case strings.HasPrefix(family, "latch_attacher_"), strings.HasPrefix(family, "csi_sidecar_"):
		return attacherPart
	case strings.HasPrefix(family, "rest_client_"), strings.HasPrefix(family, "go_"), strings.HasPrefix(family, "process_"):
		return processPart
	}
	for _, prefix := range sharedFamilies {
		if !strings.HasPrefix(family, prefix) {
			continue
		}
		for _, l := range labels {
			if l.GetName() != "name" {
				continue
			}
			switch v := l.GetValue(); {
			case strings.HasPrefix(v, "csi-attacher-"), strings.HasPrefix(v, kube.LeaseName("")):
				return attacherPart
			case strings.HasPrefix(v, "attachdetach_"), v == controllerLease:
				return controllerPart
			}
		}
	}
	return notServed
}

// partGatherer gathers the samples of from that belong to part (or to the
// whole process).
type partGatherer struct {
	from            prometheus.Gatherer
	part            part
	controllerLease string
}

func (g partGatherer) Gather() ([]*dto.MetricFamily, error) {
	families, err := g.from.Gather()
	var out []*dto.MetricFamily
	for _, f := range families {
		var kept []*dto.Metric
		for _, m := range f.GetMetric() {
			if p := owner(f.GetName(), m.GetLabel(), g.controllerLease); p == g.part || p == processPart {
				kept = append(kept, m)
			}
		}
		if len(kept) > 0 {
			f.Metric = kept
			out = append(out, f)
		}
	}
	return out, err
}

// metricsFlag names latch-local's flag in the endpoints' errors.
const metricsFlag = "--metrics-ports"

// serveMetrics makes the stack's csi-attacher and controller serve their
// metrics where opts says, on top of their configuration in so.
func serveMetrics(opts Options, so *stack.Options) {
	attacherCfg, controllerCfg := so.AttacherConfig, so.ControllerConfig
	so.AttacherConfig = func(replica int, c *attacher.SidecarConfig) {
		attacherCfg(replica, c)
		serveAttacherMetrics(opts, c)
	}
	so.ControllerConfig = func(c *controller.ServeConfig) {
		controllerCfg(c)
		serveControllerMetrics(opts, c)
	}
}

// serveAttacherMetrics makes csi-attacher serve its metrics on
// opts.AttacherMetricsAddress: csi_sidecar_operations_seconds and its part
// of the legacy registry.
func serveAttacherMetrics(opts Options, c *attacher.SidecarConfig) {
	c.HTTP.Address, c.HTTP.Flag = opts.AttacherMetricsAddress, metricsFlag
	c.MetricsGatherer = partGatherer{from: legacyregistry.DefaultGatherer, part: attacherPart}
}

// serveControllerMetrics makes the controller serve its metrics on
// opts.ControllerMetricsAddress: its own registry (a registry of its own
// for each start, as the stack's) and its part of the legacy registry.
func serveControllerMetrics(opts Options, c *controller.ServeConfig) {
	own := metrics.NewKubeRegistry()
	c.Registry = own
	c.HTTP.Address, c.HTTP.Flag = opts.ControllerMetricsAddress, metricsFlag
	lease := c.Leader.LeaseName
	c.HTTP.RegisterMetrics = func(mux *http.ServeMux, path string) {
		g := prometheus.Gatherers{own, partGatherer{from: legacyregistry.DefaultGatherer, part: controllerPart, controllerLease: lease}}
		mux.Handle(path, promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	}
}

// checkMetricsAddresses fails early, naming the flag, when a metrics
// address cannot be listened on (the controllers would only fail later, in
// the background).
func checkMetricsAddresses(opts Options) error {
	for _, addr := range []string{opts.AttacherMetricsAddress, opts.ControllerMetricsAddress} {
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("cannot serve metrics on %s (choose other ports with %s): %w", addr, metricsFlag, err)
		}
		ln.Close()
	}
	return nil
}
