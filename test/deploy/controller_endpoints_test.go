package deploy_test

import (
	"net"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// controllerContainer is an attachdetach-controller container with its
// Deployment's Pod annotations.
type controllerContainer struct {
	c           v1.Container
	annotations map[string]string
}

// eachControllerContainer checks that each rendering (by where it comes
// from) runs exactly one attachdetach-controller container and calls check
// with it, where naming the rendering and the container.
func eachControllerContainer(t *testing.T, renderings map[string][]*appsv1.Deployment, check func(where string, cc controllerContainer)) {
	t.Helper()
	for where, ds := range renderings {
		cs := map[string]controllerContainer{}
		for _, d := range ds {
			for _, c := range d.Spec.Template.Spec.Containers {
				if bin, ok := latchBinary(c.Image); ok && bin == "attachdetach-controller" {
					cs[d.Name+"/"+c.Name] = controllerContainer{c, d.Spec.Template.Annotations}
				}
			}
		}
		if len(cs) != 1 {
			t.Fatalf("%s: %d attachdetach-controller containers, want 1", where, len(cs))
		}
		for name, cc := range cs {
			check(where+" "+name, cc)
		}
	}
}

// flagValue is the value the binary sees for --name: the last occurrence
// wins (Go's flag package), def when the flag is absent.
func flagValue(args []string, name, def string) string {
	v := def
	for _, a := range args {
		if n, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "="); ok && n == name {
			v = val
		}
	}
	return v
}

// probePort resolves a probe's httpGet port (a number or a port name) to
// a container port number; 0 when it does not resolve.
func probePort(c v1.Container, p *v1.Probe) int32 {
	if p == nil || p.HTTPGet == nil {
		return 0
	}
	if p.HTTPGet.Port.Type == intstr.Int {
		return p.HTTPGet.Port.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.HTTPGet.Port.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// endpointPort is the port of a host:port flag value; 0 when it has none.
func endpointPort(t *testing.T, v string) (host string, port int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(v)
	if err != nil {
		return "", 0
	}
	n, err := net.LookupPort("tcp", p)
	if err != nil {
		return "", 0
	}
	return h, int32(n)
}

// checkControllerHealth asserts that the probes of an attachdetach-controller
// container target its --health-endpoint, which listens on every interface
// (the kubelet probes from the node, through the Pod IP), and that nothing
// but that port is declared unless metrics are on.
func checkControllerHealth(t *testing.T, where string, c v1.Container, leaderElection bool) (healthPort int32) {
	t.Helper()
	health := flagValue(c.Args, "health-endpoint", "")
	host, healthPort := endpointPort(t, health)
	if healthPort == 0 || (host != "" && host != "0.0.0.0" && host != "::") {
		t.Errorf("%s: --health-endpoint=%q, want one on every interface (\":<port>\") for the kubelet's probes", where, health)
		return 0
	}
	if p := c.ReadinessProbe; probePort(c, p) != healthPort || p.HTTPGet.Path != "/healthz" {
		t.Errorf("%s: readiness probe %+v, want GET /healthz on the health port %d", where, p, healthPort)
	}
	if leaderElection {
		if p := c.LivenessProbe; probePort(c, p) != healthPort || p.HTTPGet.Path != "/healthz/leader-election" {
			t.Errorf("%s: liveness probe %+v, want GET /healthz/leader-election on the health port %d", where, p, healthPort)
		}
	}
	return healthPort
}

// kube-controller-manager serves /metrics only behind authentication on
// its secure port. latch's attachdetach-controller manifests keep metrics
// on loopback by default (reachable with kubectl port-forward, which the
// API server authorizes) and serve only health on the Pod's interfaces, for
// the probes; the scrape overlay and attachdetachController.httpEndpoint
// bind metrics to every interface.
func TestControllerServesMetricsOnlyWhenAskedTo(t *testing.T) {
	off := map[string][]*appsv1.Deployment{
		"deploy/attachdetach-controller": deployments(t, kustomize(t, "deploy/attachdetach-controller")),
		"chart defaults":                 deployments(t, mustHelmTemplate(t, "kube-system", nil)),
		"chart leaderElection=false": deployments(t, mustHelmTemplate(t, "kube-system", map[string]any{
			"attachdetachController": map[string]any{"leaderElection": false}})),
	}
	eachControllerContainer(t, off, func(where string, cc controllerContainer) {
		c := cc.c
		// The binary's own default is loopback; an absent flag keeps it.
		metrics := flagValue(c.Args, "http-endpoint", "127.0.0.1:8080")
		if host, _ := endpointPort(t, metrics); metrics != "" && !slices.Contains([]string{"127.0.0.1", "localhost", "::1"}, host) {
			t.Errorf("%s: --http-endpoint=%q serves unauthenticated metrics on the Pod's interfaces; want loopback (or none) by default", where, metrics)
		}
		healthPort := checkControllerHealth(t, where, c, !strings.Contains(where, "leaderElection=false"))
		for _, p := range c.Ports {
			if p.ContainerPort != healthPort {
				t.Errorf("%s: declares port %s/%d besides the health port %d, but serves nothing else by default", where, p.Name, p.ContainerPort, healthPort)
			}
		}
		if cc.annotations["prometheus.io/scrape"] == "true" {
			t.Errorf("%s: Pod annotated for scraping, but metrics are on loopback only", where)
		}
	})

	on := map[string][]*appsv1.Deployment{
		"deploy/overlays/prometheus-scrape": deployments(t, kustomize(t, "deploy/overlays/prometheus-scrape")),
		"chart attachdetachController.httpEndpoint": deployments(t, mustHelmTemplate(t, "kube-system", map[string]any{
			"attachdetachController": map[string]any{"httpEndpoint": true}})),
	}
	eachControllerContainer(t, on, func(where string, cc controllerContainer) {
		c := cc.c
		if got := flagValue(c.Args, "http-endpoint", "127.0.0.1:8080"); got != ":8080" {
			t.Errorf("%s: --http-endpoint=%q, want :8080 (every interface) when metrics are asked for", where, got)
		}
		if !slices.ContainsFunc(c.Ports, func(p v1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == 8080 }) {
			t.Errorf("%s: ports %v, want http/8080", where, c.Ports)
		}
		if cc.annotations["prometheus.io/scrape"] != "true" || cc.annotations["prometheus.io/port"] != "8080" {
			t.Errorf("%s: Pod annotations %v, want the scrape annotations on port 8080", where, cc.annotations)
		}
		// Health stays where the probes look for it.
		if checkControllerHealth(t, where, c, true) == 8080 {
			t.Errorf("%s: health endpoint shares port 8080 with metrics", where)
		}
	})
}

// The two listeners cannot share a port: the chart refuses to render.
func TestChartRefusesHealthPortEqualToHTTPPort(t *testing.T) {
	_, err := helmTemplate(t, "kube-system", map[string]any{"attachdetachController": map[string]any{"healthPort": 8080}})
	if err == nil || !strings.Contains(err.Error(), "attachdetachController.healthPort must differ from httpPort") {
		t.Errorf("render error = %v, want the healthPort/httpPort message", err)
	}
}
