package reliability_test

import (
	"fmt"
	"time"

	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// replica is one csi-attacher, run under a supervisor that restarts
// RunSidecar whenever it returns (lost driver connection, lost lease) the
// way Kubernetes restarts the container (stack.RestartAttachers).
type replica struct {
	identity string
	// api cuts the replica off the API server (Partition).
	api *testsupport.APITransport
	c   *stack.Component
}

// kill is a SIGKILL stand-in: the replica's network dies first, then it
// is told to stop; nothing is awaited or released.
func (r *replica) kill() {
	r.api.Partition()
	r.c.Kill()
}

// restarts is how often the supervisor restarted the replica.
func (r *replica) restarts() int { return r.c.Restarts() }

func (e *env) startAttacher(identity string) *replica {
	r := &replica{identity: identity, api: testsupport.NewAPITransport()}
	e.apiWrites.add("csi-attacher "+identity, r.api)
	cfg := rest.CopyConfig(cluster.RESTConfig())
	cfg.QPS, cfg.Burst = 500, 1000
	cfg.Wrap(r.api.Wrap)
	r.c = e.stack.RunAttacher(e.ctx, identity, e.attacherConfig(cfg, identity))
	return r
}

// attacherConfig is the binary's configuration (stack.AttacherConfig)
// with what the suite needs faster: short CSI timeout, retries and
// reconcile, and a quick Lease when replicas elect a leader.
func (e *env) attacherConfig(cfg *rest.Config, identity string) attacher.SidecarConfig {
	c := stack.AttacherConfig(cfg, e.socket)
	c.RESTConfig.QPS, c.RESTConfig.Burst = cfg.QPS, cfg.Burst
	stack.QuickAttacher(&c)
	c.Controller.Timeout = 3 * time.Second
	c.Controller.RetryIntervalMax = 2 * time.Second
	c.Controller.ReconcileSync = 2 * time.Second
	c.Controller.ReconcileTimeout = 3 * time.Second
	c.Leader = app.LeaderElection{Enabled: e.opts.replicas > 1, Namespace: e.ns, Identity: identity}
	stack.QuickLease(&c.Leader)
	return c
}

// killAttacher kills the first live csi-attacher replica abruptly and
// starts a new one in its place (a new identity, as a new Pod would have).
func (e *env) killAttacher() {
	e.disrupted("csi-attacher killed")
	r := e.attachers[0]
	r.kill()
	e.killedAttachers++
	e.attachers[0] = e.startAttacher(fmt.Sprintf("%s-attacher-k%d", e.prefix, e.killedAttachers))
	e.attachers = append(e.attachers, r)
}
