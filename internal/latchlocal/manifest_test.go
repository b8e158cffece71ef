package latchlocal

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// manifest is the objects of a YAML file, with what a client needs to
// create and delete them by kind, as kubectl does.
type manifest struct {
	objs   []*unstructured.Unstructured
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func readManifest(t *testing.T, cfg *rest.Config, path string) *manifest {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := &manifest{dyn: dynamic.NewForConfigOrDie(cfg)}
	m.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		if obj.Object != nil {
			m.objs = append(m.objs, obj)
		}
	}
	return m
}

func (m *manifest) resource(t *testing.T, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	mapping, err := m.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s %s: %v", gvk.Kind, obj.GetName(), err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameRoot {
		return m.dyn.Resource(mapping.Resource)
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = "default"
	}
	return m.dyn.Resource(mapping.Resource).Namespace(ns)
}

// create is `kubectl create -f`.
func (m *manifest) create(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, obj := range m.objs {
		if _, err := m.resource(t, obj).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// delete is `kubectl delete -f` without its wait (background
// propagation, kubectl's default).
func (m *manifest) delete(t *testing.T, ctx context.Context) {
	t.Helper()
	bg := metav1.DeletePropagationBackground
	for _, obj := range m.objs {
		if err := m.resource(t, obj).Delete(ctx, obj.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// gone: no object of the manifest is left.
func (m *manifest) gone(t *testing.T, ctx context.Context) (bool, string) {
	t.Helper()
	for _, obj := range m.objs {
		_, err := m.resource(t, obj).Get(ctx, obj.GetName(), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, obj.GetKind() + " " + obj.GetName()
		}
	}
	return true, ""
}
