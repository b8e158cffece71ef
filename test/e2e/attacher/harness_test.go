// Package attacher_test runs csi-attacher end to end: the same RunSidecar
// the binary runs, against the in-process kube-apiserver and the mock CSI
// driver over a real unix socket.
package attacher_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

var (
	runsMu sync.Mutex
	runs   = map[string]int{}
)

func TestMain(m *testing.M) { stack.RunTestMain(m, &cluster) }

type env struct {
	t       *testing.T
	ctx     context.Context
	client  kubernetes.Interface
	stack   *stack.Stack
	driver  *csimock.Driver
	name    string // driver name
	socket  string
	writes  *testsupport.APITransport // the first replica's API writes
	node    string
	nodeID  string
	prefix  string
	stopAtt func()
	// kubeconfigPath is written on first use by kubeconfig().
	kubeconfigPath string
}

type envOptions struct {
	caps          *csimock.Capabilities
	reconcileSync time.Duration
	noCSINode     bool
	leader        bool
	// noAttacher: the test starts attachers itself (the binary, say).
	noAttacher bool
	// driverName overrides the test-unique driver name (CSI migration
	// needs the real name of a migrated driver).
	driverName string
	// competing receives the replica's latch_attacher_competing_instances
	// value (nil: the legacy registry's gauge, as in the binary).
	competing app.GaugeSetter
	// logger replaces klog's for this replica.
	logger *klog.Logger
	// retryStart overrides the suite's quick --retry-interval-start.
	retryStart time.Duration
	// skipSingleNodeCheck: the mock driver publishes a single-node volume
	// to a second node instead of refusing (csimock.Config), so a test
	// sees what the attacher alone lets through.
	skipSingleNodeCheck bool
	// driverConcurrency sets --driver-concurrency ("": the default,
	// adaptive).
	driverConcurrency string
	// flagLease keeps the Lease timings of the binary's flag defaults
	// (renew deadline 10 s) instead of stack.QuickLease's (3 s), for a
	// test whose load on the API server can hold a renewal longer than
	// that on a busy machine: the attacher would stop, as it must when
	// it cannot renew, and the test would measure that instead.
	flagLease bool
}

// newEnv starts a mock driver with a driver name unique to the test
// (stack.Start: no kubelet stand-in, no controller, replicas started here),
// a node with a CSINode entry for it, and one attacher.
func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	prefix := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(prefix) > 40 {
		prefix = prefix[len(prefix)-40:]
		prefix = strings.TrimLeft(prefix, "-")
	}
	// Runs of one test in the same process (-count=N) share the API
	// server: give every repeat names of its own.
	runsMu.Lock()
	if n := runs[t.Name()]; n > 0 {
		prefix = fmt.Sprintf("%s-r%d", prefix, n)
	}
	runs[t.Name()]++
	runsMu.Unlock()
	e := &env{
		t: t, ctx: ctx, client: cluster.Client(),
		name:   prefix + ".csi.latch.dev",
		writes: testsupport.NewAPITransport(),
		node:   prefix + "-node", nodeID: prefix + "-node-id",
		prefix: prefix,
	}
	if o.driverName != "" {
		e.name = o.driverName
	}
	s, err := stack.Start(ctx, stack.Options{
		Cluster: cluster, Driver: e.name, NoKubelet: true, NoController: true,
		Attacher: stack.AttacherOnDemand,
		Mock: func(cfg *csimock.Config) {
			if o.caps != nil {
				cfg.Capabilities = *o.caps
			}
			cfg.SkipSingleNodeCheck = o.skipSingleNodeCheck
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stack: %v", err)
		}
	})
	e.stack, e.driver, e.socket = s, s.Driver, s.Socket

	if !o.noCSINode {
		e.createCSINode(e.node, e.nodeID)
	}
	e.stopAtt = func() {}
	if !o.noAttacher {
		e.stopAtt = e.startAttacher(o, "")
	}
	t.Cleanup(func() { e.stopAtt() })
	return e
}

// startAttacher runs one attacher replica; the returned func stops it and
// waits for it to exit.
func (e *env) startAttacher(o envOptions, identity string) func() {
	cfg := cluster.RESTConfig()
	cfg.WrapTransport = e.writes.Wrap
	return e.startAttacherAs(cfg, o, identity, "default")
}

// startAttacherAs runs a replica with the given client config, leader
// election (when on) in leaseNamespace.
func (e *env) startAttacherAs(cfg *rest.Config, o envOptions, identity, leaseNamespace string) func() {
	ctx := klog.NewContext(e.ctx, klog.Background())
	if o.logger != nil {
		ctx = klog.NewContext(e.ctx, *o.logger)
	}
	// The component's name is the logger's name.
	a := e.stack.RunAttacher(ctx, identity, e.attacherConfig(cfg, o, identity, leaseNamespace))
	return sync.OnceFunc(func() {
		if err := a.Stop(); err != nil {
			e.t.Errorf("attacher %q: %v", identity, err)
		}
	})
}

// attacherConfig is the binary's configuration (stack.AttacherConfig)
// with what the suite needs faster: short CSI timeout and retries, a quick
// Lease, and the replica's leader election.
func (e *env) attacherConfig(cfg *rest.Config, o envOptions, identity, leaseNamespace string) attacher.SidecarConfig {
	c := stack.AttacherConfig(cfg, e.socket)
	c.RESTConfig.QPS, c.RESTConfig.Burst = cfg.QPS, cfg.Burst
	stack.QuickAttacher(&c)
	c.Controller.Workers = 10
	c.Controller.DriverConcurrency = o.driverConcurrency
	c.Controller.ReconcileSync = o.reconcileSync
	if o.retryStart > 0 {
		c.Controller.RetryIntervalStart = o.retryStart
	}
	c.Leader = app.LeaderElection{
		Enabled: o.leader, Namespace: leaseNamespace, Identity: identity,
		// As the binary: without leader election, still hold the Lease
		// and refuse work while another replica does.
		Presence: &app.Presence{Component: "csi-attacher", Competing: o.competing},
	}
	if o.flagLease {
		d := attacher.DefaultSidecarConfig().Leader
		c.Leader.LeaseDuration, c.Leader.RenewDeadline, c.Leader.RetryPeriod = d.LeaseDuration, d.RenewDeadline, d.RetryPeriod
	} else {
		stack.QuickLease(&c.Leader)
	}
	return c
}
