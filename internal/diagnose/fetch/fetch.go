// Package fetch reads from the API server what a diagnosis needs. It asks
// package diagnose which objects those are (diagnose.Needs) instead of
// knowing the pipeline itself, so both always agree.
package fetch

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/diagnose"
)

// maxRounds bounds the Needs loop. The longest chain (Pod → PVC → PV →
// CSIDriver/Node/CSINode/VAs → Leases/Pods/events) takes five rounds; more
// means a bug, not a big cluster.
const maxRounds = 10

// pageSize keeps list responses of big clusters small.
const pageSize = 500

// Snapshot reads everything Explain(target) needs. Reads refused by the API
// server (Forbidden) are recorded in Snapshot.Unreadable and the diagnosis
// goes on without them; other errors abort.
func Snapshot(ctx context.Context, client kubernetes.Interface, target diagnose.Target, now time.Time) (*diagnose.Snapshot, error) {
	logger := klog.FromContext(ctx)
	s := diagnose.EmptySnapshot(now)
	for round := 0; round < maxRounds; round++ {
		needs := diagnose.Needs(target, s)
		if len(needs) == 0 {
			return s, nil
		}
		logger.V(4).Info("Fetching objects for diagnosis", "round", round, "count", len(needs))
		for _, ref := range needs {
			if err := read(ctx, client, s, ref); err != nil {
				return nil, err
			}
		}
	}
	return nil, fmt.Errorf("explain %s: still missing objects after %d rounds of reads", target, maxRounds)
}

// VolumeAttachments lists every VolumeAttachment.
func VolumeAttachments(ctx context.Context, client kubernetes.Interface) ([]*storagev1.VolumeAttachment, error) {
	var out []*storagev1.VolumeAttachment
	opts := metav1.ListOptions{Limit: pageSize}
	for {
		list, err := client.StorageV1().VolumeAttachments().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list VolumeAttachments: %w", err)
		}
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
		if list.Continue == "" {
			return out, nil
		}
		opts.Continue = list.Continue
	}
}

func read(ctx context.Context, client kubernetes.Interface, s *diagnose.Snapshot, ref diagnose.Ref) error {
	klog.FromContext(ctx).V(5).Info("Reading", "ref", ref.String())
	var err error
	switch ref.Kind {
	case diagnose.RefPod:
		err = get(ctx, s, ref, client.CoreV1().Pods(ref.Namespace).Get)
	case diagnose.RefPVC:
		err = get(ctx, s, ref, client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get)
	case diagnose.RefPV:
		err = get(ctx, s, ref, client.CoreV1().PersistentVolumes().Get)
	case diagnose.RefNode:
		err = get(ctx, s, ref, client.CoreV1().Nodes().Get)
	case diagnose.RefCSINode:
		err = get(ctx, s, ref, client.StorageV1().CSINodes().Get)
	case diagnose.RefCSIDriver:
		err = get(ctx, s, ref, client.StorageV1().CSIDrivers().Get)
	case diagnose.RefPodList:
		err = list(ctx, s, ref, metav1.ListOptions{}, pagesOf(client.CoreV1().Pods(ref.Namespace).List, func(l *corev1.PodList) []corev1.Pod { return l.Items }))
	case diagnose.RefAttacherPodList:
		// Every Pod of every namespace is listed, page by page, and only
		// those with a csi-attacher container are kept.
		err = list(ctx, s, ref, metav1.ListOptions{}, attacherPodPages(client))
	case diagnose.RefVAList:
		var vas []*storagev1.VolumeAttachment
		vas, err = VolumeAttachments(ctx, client)
		if err == nil {
			for _, va := range vas {
				s.Add(va)
			}
			s.MarkRead(ref)
		}
		err = classify(s, ref, err)
	case diagnose.RefLeaseList:
		// The attacher's namespace is a deployment choice: search all.
		sel := fields.OneTermEqualSelector("metadata.name", ref.Name).String()
		err = list(ctx, s, ref, metav1.ListOptions{FieldSelector: sel}, pagesOf(client.CoordinationV1().Leases(metav1.NamespaceAll).List, func(l *coordinationv1.LeaseList) []coordinationv1.Lease { return l.Items }))
	case diagnose.RefEventList:
		sel := fields.Set{"involvedObject.kind": string(ref.Of), "involvedObject.name": ref.Name}
		// Events about cluster-scoped objects may be in any namespace.
		ns := ref.Namespace
		if ns != "" {
			sel["involvedObject.namespace"] = ns
		}
		err = list(ctx, s, ref, metav1.ListOptions{FieldSelector: sel.AsSelector().String()}, pagesOf(client.CoreV1().Events(ns).List, func(l *corev1.EventList) []corev1.Event { return l.Items }))
	default:
		return fmt.Errorf("read %s: unknown kind", ref)
	}
	return err
}

// get reads one object with a typed client's Get.
func get[T runtime.Object](ctx context.Context, s *diagnose.Snapshot, ref diagnose.Ref, getFn func(context.Context, string, metav1.GetOptions) (T, error)) error {
	obj, err := getFn(ctx, ref.Name, metav1.GetOptions{})
	if err == nil {
		s.Add(obj)
		s.MarkRead(ref)
		return nil
	}
	return classify(s, ref, err)
}

type pageFunc func(ctx context.Context, opts metav1.ListOptions) ([]runtime.Object, string, error)

// pagesOf is the pageFunc of a typed client's List: items takes the list's
// items, which the page returns as pointers into the list.
func pagesOf[L metav1.ListInterface, T any, PT interface {
	*T
	runtime.Object
}](listFn func(context.Context, metav1.ListOptions) (L, error), items func(L) []T) pageFunc {
	return func(ctx context.Context, opts metav1.ListOptions) ([]runtime.Object, string, error) {
		l, err := listFn(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		its := items(l)
		objs := make([]runtime.Object, len(its))
		for i := range its {
			objs[i] = PT(&its[i])
		}
		return objs, l.GetContinue(), nil
	}
}

// attacherPodPages lists Pods in all namespaces and keeps the ones
// diagnose.IsAttacherPod accepts.
func attacherPodPages(client kubernetes.Interface) pageFunc {
	all := pagesOf(client.CoreV1().Pods(metav1.NamespaceAll).List, func(l *corev1.PodList) []corev1.Pod { return l.Items })
	return func(ctx context.Context, opts metav1.ListOptions) ([]runtime.Object, string, error) {
		objs, cont, err := all(ctx, opts)
		kept := objs[:0]
		for _, o := range objs {
			if diagnose.IsAttacherPod(o.(*corev1.Pod)) {
				kept = append(kept, o)
			}
		}
		return kept, cont, err
	}
}

func list(ctx context.Context, s *diagnose.Snapshot, ref diagnose.Ref, opts metav1.ListOptions, page pageFunc) error {
	opts.Limit = pageSize
	for {
		objs, cont, err := page(ctx, opts)
		if err != nil {
			return classify(s, ref, err)
		}
		for _, obj := range objs {
			s.Add(obj)
		}
		if cont == "" {
			s.MarkRead(ref)
			return nil
		}
		opts.Continue = cont
	}
}

// classify records a "not found" or a refused read in the snapshot and
// returns every other error, naming what was read.
func classify(s *diagnose.Snapshot, ref diagnose.Ref, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		s.MarkRead(ref)
		return nil
	case apierrors.IsForbidden(err):
		s.Unreadable[ref] = "forbidden"
		return nil
	}
	return fmt.Errorf("read %s: %w", ref, err)
}
