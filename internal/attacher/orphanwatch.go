package attacher

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/kube"
)

// watchRecord reads the record again whenever its ConfigMap changes, until
// ctx is done: an entry another attacher wrote after this one read the
// record (an old leader whose publish returned after it lost the Lease,
// say) is adopted at once, so its publication is settled here and a
// publish of its volume elsewhere waits for it
// (decide.PublishBlockedByOrphan). It is an informer on that one
// ConfigMap (list and watch with a metadata.name field selector, which
// RBAC's resourceNames can limit), not a read on every pass that needs the
// record: those are every attach, and the record rarely changes.
//
// A list or watch the API server refuses is reported once per streak of
// failures (recordFailed, a Warning event on the Lease) and retried by the
// informer with its own backoff; the record still works for what get and
// update allow.
func (c *Controller) watchRecord(ctx context.Context) {
	store, ok := c.exec.records.(*configMapOrphanStore)
	if !ok {
		return
	}
	logger := klog.FromContext(ctx).WithName("orphan-record")
	factory := informers.NewSharedInformerFactoryWithOptions(store.client, 0, informers.WithNamespace(store.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", store.name).String()
		}))
	informer := factory.Core().V1().ConfigMaps().Informer()
	var failing atomic.Bool
	_ = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return
		}
		why := c.recordFailed("watch", err)
		if failing.Swap(true) {
			logger.V(2).Info("Watching the orphaned-publication record failed again", "err", err)
			return
		}

		logger.Error(err, "Cannot watch the orphaned-publication record: an entry another attacher writes after this one started is not seen until it restarts",
			"configMap", c.recordName(), "rule", kube.OrphanRecordRule(c.cfg.OrphanNamespace, c.cfg.Driver.Name))
		c.exec.recorder.Event(c.leaseRef(), v1.EventTypeWarning, EventOrphanRecordFailed,
			why+"; csi-attacher does not see an entry another attacher writes after it started until it restarts")
	})
	changed := func(obj any) {
		cm, ok := obj.(*v1.ConfigMap)
		if !ok || cm.Name != store.name {
			return
		}
		if failing.Swap(false) {
			logger.Info("Watching the orphaned-publication record again", "configMap", c.recordName())
			c.exec.recorder.Event(c.leaseRef(), v1.EventTypeNormal, EventOrphanRecordAvailable,
				fmt.Sprintf("the orphan record, ConfigMap %s, is watched again", c.recordName()))
		}
		c.recordChanged(klog.NewContext(ctx, logger), cm)
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
	}); err != nil {
		logger.Error(err, "Cannot watch the orphaned-publication record")
		return
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// recordChanged adopts what the record holds now (adoptRecords).
func (c *Controller) recordChanged(ctx context.Context, cm *v1.ConfigMap) {
	recs, invalid := parseRecords(cm, c.exec.records.(*configMapOrphanStore).String())
	if invalid != nil {
		c.invalidEntries(ctx, invalid)
	}
	c.adoptRecords(ctx, recs)
}
