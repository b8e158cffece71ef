package app

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
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
