package localcluster

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

var shared *Cluster

func TestMain(m *testing.M) { os.Exit(RunTestMain(m, &shared)) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestClusterRestartKeepsAddressObjectsAndClients(t *testing.T) {
	ctx := testContext(t)
	start := time.Now()
	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("cluster ready in %s", time.Since(start))
	dataDir := c.DataDir()
	client := c.Client()

	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before-restart", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap: %v", err)
	}

	c.StopAPIServer()
	downCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := client.CoreV1().ConfigMaps("default").Get(downCtx, "before-restart", metav1.GetOptions{}); err == nil {
		t.Fatalf("API server answered while stopped")
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatalf("StartAPIServer: %v", err)
	}
	// The same client (same address, CA and token) works again.
	got, err := client.CoreV1().ConfigMaps("default").Get(ctx, "before-restart", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get configmap after restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Fatalf("configmap data after restart = %v, want k=v", got.Data)
	}

	host := c.Host()
	c.Stop()
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("temporary data dir %s still exists after Stop (err=%v)", dataDir, err)
	}
	if conn, err := net.DialTimeout("tcp", host[len("https://"):], time.Second); err == nil {
		conn.Close()
		t.Errorf("cluster address %s still accepts connections after Stop", host)
	}
}

func TestClusterKeepDataSurvivesFullStop(t *testing.T) {
	ctx := testContext(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	c, err := Start(ctx, Options{DataDir: dir, KeepData: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	c.Stop()

	c2, err := Start(ctx, Options{DataDir: dir, KeepData: true})
	if err != nil {
		t.Fatalf("second Start on kept data: %v", err)
	}
	defer c2.Stop()
	if _, err := c2.Client().CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace created before the stop is gone: %v", err)
	}
}

func TestKubeconfigWorksForExternalClients(t *testing.T) {
	ctx := testContext(t)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := shared.WriteKubeconfig(path); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	if _, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("get default namespace through kubeconfig: %v", err)
	}
}

func TestAnonymousConfigIsForbiddenByRBAC(t *testing.T) {
	ctx := testContext(t)
	client := kubernetes.NewForConfigOrDie(shared.AnonymousConfig())
	_, err := client.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) {
		t.Fatalf("anonymous list secrets: err = %v, want Forbidden or Unauthorized (RBAC on)", err)
	}
}
