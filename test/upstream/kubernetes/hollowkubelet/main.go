// Command hollow-kubelet runs the real kubelet (Kubernetes v1.37.2's
// kubelet code with kubemark's fake container runtime and fake mounter) as
// one simulated node of latch's test cluster. It differs from kubemark's own
// hollow node where latch's tests need it to:
//   - the node's attach/detach is controller-managed (kubemark turns it
//     off), so the attach/detach controller under test attaches its volumes;
//   - it serves on loopback only, under a root directory the test chooses;
//   - it uses the fake image service, never a host containerd.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"
)

func main() {
	var (
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the cluster")
		name       = flag.String("name", "", "node name")
		rootDir    = flag.String("root-dir", "", "the kubelet's root directory (plugins_registry, pods, plugins live here)")
		port       = flag.Int("port", 0, "the kubelet's loopback port")
		maxPods    = flag.Int("max-pods", 110, "pods this node accepts")
		healthz    = flag.Int("healthz-port", 0, "the kubelet's loopback healthz port (0: none)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *name, *rootDir, *port, *healthz, *maxPods); err != nil {
		fmt.Fprintf(os.Stderr, "hollow-kubelet %s: %v\n", *name, err)
		os.Exit(1)
	}
}

func run(kubeconfig, name, rootDir string, port, healthz, maxPods int) error {
	if kubeconfig == "" || name == "" || rootDir == "" || port == 0 {
		return fmt.Errorf("--kubeconfig, --name, --root-dir and --port are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "hollow-kubelet"
	client, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: name, KubeletPort: port, MaxPods: maxPods,
	})
	// kubemark makes a temporary root with the static-pod and pod-log
	// directories in it; everything goes under --root-dir instead, so
	// nothing is left behind when the caller removes it.
	kubemarkTmp := f.RootDirectory
	f.RootDirectory = rootDir
	c.StaticPodPath = filepath.Join(rootDir, "static-pods")
	c.PodLogsDir = filepath.Join(rootDir, "pod-logs")
	for _, dir := range []string{c.StaticPodPath, c.PodLogsDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(kubemarkTmp); err != nil {
		return err
	}
	// Several kubelets run on one machine: each its own healthz port (or
	// none), never the default 10248 they would all fight over.
	c.HealthzBindAddress = "127.0.0.1"
	c.HealthzPort = int32(healthz)
	c.Address = "127.0.0.1"
	c.ReadOnlyPort = 0
	c.EnableControllerAttachDetach = true
	c.NodeStatusUpdateFrequency.Duration = 2 * time.Second
	c.SyncFrequency.Duration = 2 * time.Second

	hb := *cfg
	hb.Timeout = c.NodeStatusUpdateFrequency.Duration
	hb.QPS = -1
	heartbeat, err := clientset.NewForConfig(&hb)
	if err != nil {
		return err
	}
	endpoint, err := fakeremote.GenerateEndpoint()
	if err != nil {
		return err
	}
	runtime := fakeremote.NewFakeRemoteRuntime()
	if err := runtime.Start(endpoint); err != nil {
		return err
	}
	defer runtime.Stop()
	runtimeService, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return err
	}
	k := kubemark.NewHollowKubelet(f, c, client, heartbeat, &testing.Fake{NodeName: name},
		runtime.ImageService, runtimeService, cm.NewStubContainerManager())
	go k.Run(ctx)
	<-ctx.Done()
	return nil
}
