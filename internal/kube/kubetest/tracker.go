// Package kubetest is support for unit tests that run the controllers on
// client-go's fake clientset. Only tests import it.
package kubetest

import (
	"strconv"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"
)

// VersionedTracker stamps a growing resourceVersion on every object it
// stores, as the API server does. client-go's tracker versions objects
// internally but leaves the field empty, so without this no guarded patch
// could be built and no read-your-writes logic could be exercised. The
// object is stamped in place: a patch reaction returns the very object
// that was stored.
type VersionedTracker struct {
	clienttesting.ObjectTracker
	rv atomic.Int64
}

var _ clienttesting.ObjectTracker = (*VersionedTracker)(nil)

func (t *VersionedTracker) stamp(obj runtime.Object) runtime.Object {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetResourceVersion(strconv.FormatInt(t.rv.Add(1), 10))
	}
	return obj
}

func (t *VersionedTracker) Add(obj runtime.Object) error {
	return t.ObjectTracker.Add(t.stamp(obj))
}

func (t *VersionedTracker) Create(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.CreateOptions) error {
	return t.ObjectTracker.Create(gvr, t.stamp(obj), ns, opts...)
}

func (t *VersionedTracker) Update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.UpdateOptions) error {
	return t.ObjectTracker.Update(gvr, t.stamp(obj), ns, opts...)
}

func (t *VersionedTracker) Patch(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	return t.ObjectTracker.Patch(gvr, t.stamp(obj), ns, opts...)
}
