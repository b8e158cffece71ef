// Package deploy_test checks what operators install: every kustomization
// under deploy/ and the Helm chart under charts/ render, pass the real API
// server's validation and admission (server-side dry-run on the in-process
// kube-apiserver), follow the security baseline, and only use flags the
// binaries have; build/Dockerfile builds real binaries; the Grafana dashboard
// only queries metrics the binaries export.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	kubectlcmd "k8s.io/kubectl/pkg/cmd"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

// runAsKubectl makes the test binary run kubectl's command instead of the
// tests, to exercise kubectl's plugin mechanism without an installed kubectl.
const runAsKubectl = "LATCH_TEST_RUN_KUBECTL"

func TestMain(m *testing.M) {
	if os.Getenv(runAsKubectl) == "1" {
		os.Args[0] = "kubectl"
		if err := kubectlcmd.NewDefaultKubectlCommand().Execute(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := localcluster.RunTestMain(m, &cluster)
	removeBinaries()
	testsupport.RemoveBinaries() // latch-local, for the README's build line
	os.Exit(code)
}

// repoRoot is the module root: two directories above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// decodeYAML splits a multi-document YAML stream into objects, skipping
// empty documents.
func decodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// dryRunApply creates every Namespace in objs, and every namespace the
// objects live in, for real (a dry-run Namespace would not exist for the
// objects in it; a base meant to be overlaid into an existing namespace
// expects it to exist), then creates every other object with server-side
// dry-run, so that the API server's validation and admission judge it
// without storing it. It returns one error per rejected object.
func dryRunApply(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) []error {
	t.Helper()
	cfg := cluster.RESTConfig()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	if err := installOperatorCRDs(ctx, t, client, objs); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "Namespace" {
			continue
		}
		ns := &v1.Namespace{}
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ns); err != nil {
			errs = append(errs, fmt.Errorf("Namespace %s: %w", o.GetName(), err))
			continue
		}
		if _, err := cluster.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{FieldManager: "latch-deploy-test"}); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, fmt.Errorf("create Namespace %s: %w", o.GetName(), err))
		}
	}
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" {
			if err := localcluster.CreateNamespace(ctx, cluster.Client(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, err)
			}
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		gvk := o.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: no such resource on the API server: %w", gvk, o.GetName(), err))
			continue
		}
		var ri dynamic.ResourceInterface = client.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			if o.GetNamespace() == "" {
				errs = append(errs, fmt.Errorf("%s %s: namespaced but has no namespace", gvk.Kind, o.GetName()))
				continue
			}
			ri = client.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "latch-deploy-test", FieldValidation: metav1.FieldValidationStrict}); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err))
		}
	}
	return errs
}

// deployments returns the Deployments among objs.
func deployments(t *testing.T, objs []*unstructured.Unstructured) []*appsv1.Deployment {
	t.Helper()
	return objectsOf[appsv1.Deployment](t, objs, "Deployment")
}

// objectsOf returns the objects of kind among objs as T.
func objectsOf[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) []*T {
	t.Helper()
	var out []*T
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		typed := new(T)
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, typed); err != nil {
			t.Fatalf("%s %s: %v", kind, o.GetName(), err)
		}
		out = append(out, typed)
	}
	return out
}

// securityProblems lists how a Deployment breaks the baseline every latch
// container follows: non-root, read-only root filesystem, no privilege
// escalation, every capability dropped.
func securityProblems(d *appsv1.Deployment) []string {
	var out []string
	pod := d.Spec.Template.Spec
	podNonRoot := pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		sc := c.SecurityContext
		where := fmt.Sprintf("Deployment %s container %s", d.Name, c.Name)
		if sc == nil {
			out = append(out, where+": no securityContext")
			continue
		}
		nonRoot := podNonRoot
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
		if !nonRoot {
			out = append(out, where+": may run as root (runAsNonRoot not true)")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			out = append(out, where+": root filesystem is writable")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			out = append(out, where+": privilege escalation allowed")
		}
		if sc.Privileged != nil && *sc.Privileged {
			out = append(out, where+": privileged")
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			out = append(out, where+": capabilities not reduced to none (drop ALL, add nothing)")
		}
	}
	return out
}
