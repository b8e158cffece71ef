package app

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	clienttesting "k8s.io/client-go/testing"
)

// leaseFaults is a fake clientset whose Lease Gets and Updates fail with
// what fail returns for their context (nil: the fake answers).
type leaseFaults struct {
	*fake.Clientset
	fail func(ctx context.Context) error
}

func (c leaseFaults) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return faultyCoordination{c.Clientset.CoordinationV1(), c.fail}
}

type faultyCoordination struct {
	coordinationv1client.CoordinationV1Interface
	fail func(ctx context.Context) error
}

func (c faultyCoordination) Leases(ns string) coordinationv1client.LeaseInterface {
	return faultyLeases{c.CoordinationV1Interface.Leases(ns), c.fail}
}

type faultyLeases struct {
	coordinationv1client.LeaseInterface
	fail func(ctx context.Context) error
}

func (l faultyLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if err := l.fail(ctx); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Get(ctx, name, o)
}

func (l faultyLeases) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := l.fail(ctx); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Update(ctx, lease, o)
}

// leaseAPI is a fake clientset whose Lease writes check and set the
// resourceVersion as the API server does: an update that carries a
// resourceVersion other than the stored one is a conflict, and every
// write stores a new one. (The fake alone stores any update, so a write
// based on a stale read would overwrite another holder's.)
func leaseAPI(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	var (
		mu   sync.Mutex
		next = 1000
	)
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	c.PrependReactor("create", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		l := a.(clienttesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		mu.Lock()
		defer mu.Unlock()
		next++
		l.ResourceVersion = strconv.Itoa(next)
		if err := c.Tracker().Create(gvr, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l.DeepCopy(), nil
	})
	c.PrependReactor("update", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		l := a.(clienttesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		mu.Lock()
		defer mu.Unlock()
		cur, err := c.Tracker().Get(gvr, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		if stored := cur.(*coordinationv1.Lease).ResourceVersion; l.ResourceVersion != "" && l.ResourceVersion != stored {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name,
				fmt.Errorf("the object has been modified: resourceVersion %s, stored %s", l.ResourceVersion, stored))
		}
		next++
		l.ResourceVersion = strconv.Itoa(next)
		if err := c.Tracker().Update(gvr, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l.DeepCopy(), nil
	})
	return c
}
