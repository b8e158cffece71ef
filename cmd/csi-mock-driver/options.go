package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/csimock"
)

// options is everything the command line says.
type options struct {
	csiAddress   string
	httpEndpoint string
	faultConfig  string
	// latencies are per-method delays from --latency, turned into fault
	// rules.
	latencies []csimock.Rule
	// nodes are the node endpoints of --node-endpoint.
	nodes   []csimock.NodeConfig
	driver  csimock.Config
	version bool
}

// parseFlags turns args into options; it touches no global state except
// klog's flags, which are process-wide by design.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{driver: csimock.DefaultConfig()}
	fs := flag.NewFlagSet("csi-mock-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)

	fs.StringVar(&o.csiAddress, "csi-address", "/run/csi/socket", "Unix socket to serve CSI on (a path or unix://path).")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "Loopback host:port for the JSON observability/control endpoint (/calls, /stats, /state, /faults). Empty disables it.")
	fs.StringVar(&o.faultConfig, "fault-config", "", "YAML or JSON file with fault rules to install at start.")
	fs.BoolVar(&o.version, "version", false, "Print the version and exit.")

	c := &o.driver
	fs.StringVar(&c.Name, "driver-name", c.Name, "Driver name returned by GetPluginInfo.")
	fs.StringVar(&c.VendorVersion, "vendor-version", c.VendorVersion, "Vendor version returned by GetPluginInfo.")
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "Node ID the node service reports in NodeGetInfo.")
	fs.BoolVar(&c.NodeService, "node-service", c.NodeService, "Serve the (minimal, in-memory) CSI Node service.")
	fs.BoolVar(&c.Capabilities.ControllerService, "controller-service", c.Capabilities.ControllerService, "Advertise the CONTROLLER_SERVICE plugin capability; without it every Controller RPC is Unimplemented.")
	fs.BoolVar(&c.Capabilities.CreateDeleteVolume, "create-delete-volume", c.Capabilities.CreateDeleteVolume, "Advertise and serve CREATE_DELETE_VOLUME.")
	fs.BoolVar(&c.Capabilities.PublishUnpublishVolume, "publish-unpublish-volume", c.Capabilities.PublishUnpublishVolume, "Advertise and serve PUBLISH_UNPUBLISH_VOLUME.")
	fs.BoolVar(&c.Capabilities.PublishReadonly, "publish-readonly", c.Capabilities.PublishReadonly, "Advertise PUBLISH_READONLY (readonly publishes are InvalidArgument without it).")
	fs.BoolVar(&c.Capabilities.ListVolumes, "list-volumes", c.Capabilities.ListVolumes, "Advertise and serve LIST_VOLUMES.")
	fs.BoolVar(&c.Capabilities.ListVolumesPublishedNodes, "list-volumes-published-nodes", c.Capabilities.ListVolumesPublishedNodes, "Advertise LIST_VOLUMES_PUBLISHED_NODES and report published nodes in ListVolumes.")
	fs.BoolVar(&c.Capabilities.SingleNodeMultiWriter, "single-node-multi-writer", c.Capabilities.SingleNodeMultiWriter, "Advertise SINGLE_NODE_MULTI_WRITER (the SINGLE_NODE_{SINGLE,MULTI}_WRITER modes are InvalidArgument without it).")
	fs.Int64Var(&c.MaxVolumesPerNode, "max-volumes-per-node", 0, "Maximum volumes published to one node (ResourceExhausted beyond); 0 is unlimited.")
	knownNodes := fs.String("known-nodes", "", "Comma-separated node IDs that exist; publishing to any other is NotFound. Empty accepts every node ID.")
	fs.BoolVar(&c.AutoCreateVolumes, "auto-create-volumes", false, "ControllerPublishVolume creates unknown volume IDs instead of returning NotFound (for benchmarks).")
	fs.BoolVar(&c.SkipSingleNodeCheck, "skip-single-node-check", false, "Do not reject publishing a single-node volume to a second node; only record the violation in /stats.")
	fs.DurationVar(&c.ProbeNotReadyFor, "probe-not-ready-for", 0, "Probe reports not ready for this long after start.")
	fs.Uint64Var(&c.Seed, "seed", 1, "Seed for probabilistic fault rules without their own seed.")
	fs.IntVar(&c.CallLogSize, "call-log-size", csimock.DefaultCallLogSize, "Number of calls kept in the call log.")
	fs.Func("latency", "Per-method latency, Method=duration[,Method=duration...]; repeatable. Example: ControllerPublishVolume=200ms.", func(s string) error {
		rules, err := parseLatencies(s)
		o.latencies = append(o.latencies, rules...)
		return err
	})

	backendProfile := fs.String("backend", "", "Model a storage backend behind ControllerPublishVolume and ControllerUnpublishVolume: a built-in profile ("+strings.Join(csimock.ProfileNames(), ", ")+"). Latency, capacity and request limit as docs/csi-mock-driver.md describes; empty answers at once with unlimited capacity.")
	backendFile := fs.String("backend-file", "", "YAML or JSON file describing the backend model field by field (or {profile: NAME}); exclusive with --backend.")
	fs.Func("node-endpoint", "Serve a node plugin for one node on a socket of its own: node-id=ID,socket=PATH[,registration-dir=DIR]; repeatable, one per node. With registration-dir (a kubelet's <root-dir>/plugins_registry) the kubelet plugin-registration service is served there as <driver-name>-reg.sock, so that kubelet registers the driver.", func(s string) error {
		n, err := parseNodeEndpoint(s)
		o.nodes = append(o.nodes, n)
		return err
	})

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	switch {
	case *backendProfile != "" && *backendFile != "":
		return nil, fmt.Errorf("--backend and --backend-file are exclusive")
	case *backendProfile != "":
		b, err := csimock.ProfileBackend(*backendProfile)
		if err != nil {
			return nil, fmt.Errorf("--backend: %w", err)
		}
		c.Backend = &b
	case *backendFile != "":
		data, err := os.ReadFile(*backendFile)
		if err != nil {
			return nil, fmt.Errorf("--backend-file: %w", err)
		}
		b, err := csimock.ParseBackend(data)
		if err != nil {
			return nil, fmt.Errorf("--backend-file %s: %w", *backendFile, err)
		}
		c.Backend = &b
	}
	if *knownNodes != "" {
		c.KnownNodes = strings.Split(*knownNodes, ",")
	}
	if o.httpEndpoint != "" {
		if err := requireLoopback(o.httpEndpoint); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// parseNodeEndpoint reads node-id=ID,socket=PATH[,registration-dir=DIR].
func parseNodeEndpoint(s string) (csimock.NodeConfig, error) {
	var n csimock.NodeConfig
	for _, part := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || value == "" {
			return n, fmt.Errorf("--node-endpoint %q: %q is not key=value", s, part)
		}
		switch key {
		case "node-id":
			n.NodeID = value
		case "socket":
			n.Socket = value
		case "registration-dir":
			n.RegistrationDir = value
		default:
			return n, fmt.Errorf("--node-endpoint %q: unknown key %q (want node-id, socket, registration-dir)", s, key)
		}
	}
	if n.NodeID == "" || n.Socket == "" {
		return n, fmt.Errorf("--node-endpoint %q: node-id and socket are required", s)
	}
	return n, nil
}

func parseLatencies(s string) ([]csimock.Rule, error) {
	var out []csimock.Rule
	for _, part := range strings.Split(s, ",") {
		method, dur, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("latency %q: want Method=duration", part)
		}
		d, err := time.ParseDuration(dur)
		if err != nil {
			return nil, fmt.Errorf("latency %q: %w", part, err)
		}
		out = append(out, csimock.Rule{ID: "latency-" + method, Method: method, Latency: d})
	}
	return out, nil
}

// requireLoopback refuses to expose the unauthenticated control endpoint
// (which can crash the driver) beyond this machine.
func requireLoopback(hostPort string) error {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return fmt.Errorf("--http-endpoint: %w", err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--http-endpoint %q: must be a loopback address such as 127.0.0.1:8080", hostPort)
}
