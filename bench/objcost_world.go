package bench

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
)

// The per-object cost benchmark (issue 23 step 5, docs/scale.md "Per-object
// cost") prices the scale scenario's objects: they are built by the scale
// world's own constructors (scaleWorld.createVolume, createPod,
// patchAttached, and the kubelet stand-in's AddNode, which also runs the
// Pods and reports volumesInUse) through an API server or a fake clientset,
// then kept protobuf-encoded, the form an informer receives them in, and
// served to the controllers by a fake clientset.

// objKinds are the kinds the two controllers cache, with their resources.
var objKinds = []struct {
	kind     string
	resource schema.GroupVersionResource
}{
	{"Pod", v1.SchemeGroupVersion.WithResource("pods")},
	{"Node", v1.SchemeGroupVersion.WithResource("nodes")},
	{"PVC", v1.SchemeGroupVersion.WithResource("persistentvolumeclaims")},
	{"PV", v1.SchemeGroupVersion.WithResource("persistentvolumes")},
	{"VA", storagev1.SchemeGroupVersion.WithResource("volumeattachments")},
	{"CSINode", storagev1.SchemeGroupVersion.WithResource("csinodes")},
}

// objWorld is a scale world of nodes and volumes held by a fake clientset.
type objWorld struct {
	driver         string
	nodes, volumes int
	client         *fake.Clientset
	// lists holds each resource's List as the API server would send it
	// (protobuf); the clientset's list reactor decodes it afresh for every
	// informer, so a cache never shares memory with the fake's tracker.
	lists map[string][]byte
	// objects holds each kind's objects, each encoded on its own.
	objects map[string][][]byte
}

var protoSerializer = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// buildObjWorld builds the scale scenario's objects for nodes and volumes:
// per node a Node and its CSINode, per volume a bound PVC/PV pair, a
// running Pod and an attached VolumeAttachment, and every volume in its
// node's status.volumesAttached and volumesInUse. They are created through
// client, an API server's (real objects: defaults, managed fields, server
// metadata) or, when nil, a fake clientset's (faster, without what the API
// server adds). Either way the controllers are then run on a fake
// clientset holding the objects (see objWorld.lists).
func buildObjWorld(ctx context.Context, client kubernetes.Interface, nodes, volumes int) (*objWorld, error) {
	if client == nil {
		client = fake.NewClientset()
	}
	mock := csimock.DefaultConfig()
	id := newRunID()
	mock.Name = "scale-" + id + ".csi.latch.dev"
	mock.NodeService = false
	driverMock, err := csimock.New(mock)
	if err != nil {
		return nil, fmt.Errorf("mock driver: %w", err)
	}
	w := &scaleWorld{
		prefix: "s" + id, driver: mock.Name, ns: "default", label: "latch-scale=" + id,
		nodes: nodes, volumes: volumes, client: client, creators: 32, driverMock: driverMock,
	}
	w.kubelet = localcluster.NewKubelet(client)
	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.kubelet.Run(kctx, 4) }()
	defer func() { stop(); <-done }()

	labels := map[string]string{"latch-scale": id}
	steps := []struct {
		name string
		n    int
		f    func(ctx context.Context, i int) error
	}{
		{"nodes", nodes, func(ctx context.Context, i int) error {
			return w.kubelet.AddNode(ctx, localcluster.NodeConfig{Name: w.node(i), Labels: labels,
				Drivers: map[string]string{w.driver: stack.NodeID(w.node(i))}})
		}},
		{"volumes", volumes, func(ctx context.Context, i int) error { return w.createVolume(ctx, i, true) }},
		{"node status", nodes, w.patchAttached},
		{"pods", volumes, w.createPod},
	}
	for _, s := range steps {
		if err := parallel(ctx, s.n, w.creators, s.f); err != nil {
			return nil, fmt.Errorf("create %s: %w", s.name, err)
		}
	}
	if err := waitObjWorldRunning(ctx, w); err != nil {
		return nil, err
	}
	stop()
	<-done

	lists, err := listObjWorld(ctx, w)
	if err != nil {
		return nil, err
	}
	ow := &objWorld{driver: w.driver, nodes: nodes, volumes: volumes,
		lists: map[string][]byte{}, objects: map[string][][]byte{}}
	var all []runtime.Object
	for _, k := range objKinds {
		items, err := meta.ExtractList(lists[k.kind])
		if err != nil {
			return nil, err
		}
		want := volumes
		if k.kind == "Node" || k.kind == "CSINode" {
			want = nodes
		}
		if len(items) != want {
			return nil, fmt.Errorf("the world has %d %ss, want %d", len(items), k.kind, want)
		}
		for _, obj := range items {
			b, err := encodeObject(obj)
			if err != nil {
				return nil, fmt.Errorf("encode %s: %w", k.kind, err)
			}
			ow.objects[k.kind] = append(ow.objects[k.kind], b)
		}
		all = append(all, items...)
		if ow.lists[k.resource.Resource], err = encodeObject(lists[k.kind]); err != nil {
			return nil, fmt.Errorf("encode %s list: %w", k.kind, err)
		}
	}
	// The controllers run on a fake clientset holding the world (for
	// watches and any write), whose informers list through this reactor:
	// a fresh decode each time, as from an API server, so that no cache
	// shares memory with the fake's tracker.
	ow.client = fake.NewClientset(all...)
	ow.client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		b, ok := ow.lists[a.GetResource().Resource]
		if !ok {
			return false, nil, nil
		}
		obj, err := decodeObject(b)
		return true, obj, err
	})
	return ow, nil
}

// listObjWorld lists the world's objects by kind.
func listObjWorld(ctx context.Context, w *scaleWorld) (map[string]runtime.Object, error) {
	sel := metav1.ListOptions{LabelSelector: w.label}
	core, storage := w.client.CoreV1(), w.client.StorageV1()
	out := map[string]runtime.Object{}
	var err error
	if out["Pod"], err = core.Pods(w.ns).List(ctx, sel); err != nil {
		return nil, err
	}
	if out["Node"], err = core.Nodes().List(ctx, sel); err != nil {
		return nil, err
	}
	if out["PVC"], err = core.PersistentVolumeClaims(w.ns).List(ctx, sel); err != nil {
		return nil, err
	}
	if out["PV"], err = core.PersistentVolumes().List(ctx, sel); err != nil {
		return nil, err
	}
	if out["VA"], err = storage.VolumeAttachments().List(ctx, sel); err != nil {
		return nil, err
	}
	// CSINodes carry no labels: the world's are its nodes' names.
	csiNodes, err := storage.CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{}
	for i := range w.nodes {
		ours[w.node(i)] = true
	}
	csiNodes.Items = slices.DeleteFunc(csiNodes.Items, func(n storagev1.CSINode) bool { return !ours[n.Name] })
	out["CSINode"] = csiNodes
	return out, nil
}

// waitObjWorldRunning waits until the kubelet stand-in runs every Pod and
// every node reports its volumes in use.
func waitObjWorldRunning(ctx context.Context, w *scaleWorld) error {
	var running, inUse int
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		sel := metav1.ListOptions{LabelSelector: w.label}
		pods, err := w.client.CoreV1().Pods(w.ns).List(ctx, sel)
		if err != nil {
			return false, err
		}
		running = 0
		for _, p := range pods.Items {
			if p.Status.Phase == v1.PodRunning {
				running++
			}
		}
		nodes, err := w.client.CoreV1().Nodes().List(ctx, sel)
		if err != nil {
			return false, err
		}
		inUse = 0
		for _, n := range nodes.Items {
			inUse += len(n.Status.VolumesInUse)
		}
		return running == w.volumes && inUse == w.volumes, nil
	})
	if err != nil {
		return fmt.Errorf("the kubelet stand-in runs %d of %d Pods and reports %d of %d volumes in use: %w",
			running, w.volumes, inUse, w.volumes, err)
	}
	return nil
}

// encodeObject encodes obj in protobuf, with its kind.
func encodeObject(obj runtime.Object) ([]byte, error) {
	obj = obj.DeepCopyObject()
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	var buf bytes.Buffer
	if err := protoSerializer.Encode(obj, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeObject decodes what encodeObject encoded; the kind is cleared
// again, as on the items of a List an informer receives.
func decodeObject(b []byte) (runtime.Object, error) {
	obj, _, err := protoSerializer.Decode(b, nil, nil)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	return obj, nil
}
