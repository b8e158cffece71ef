package attacher

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/kube"
)

// OrphanRecordName is the name of the ConfigMap holding driver's orphaned
// publications (kube.OrphanRecordName, which latchctl's hints name too).
func OrphanRecordName(driver string) string { return kube.OrphanRecordName(driver) }

// orphanRecord is one entry of the durable record: what a restarted
// attacher needs to unpublish. The secret is kept as a reference only;
// its values are read again when the unpublish is tried.
type orphanRecord struct {
	VolumeAttachment string    `json:"volumeAttachment"`
	UID              types.UID `json:"uid"`
	VolumeHandle     string    `json:"volumeHandle"`
	NodeID           string    `json:"nodeID"`
	NodeName         string    `json:"nodeName,omitempty"`
	// SecretRef is "namespace/name" of the controller-publish secret:
	// written for older attachers, never read (decide.RecordedOrphanSecret).
	SecretRef string `json:"secretRef,omitempty"`
	// PersistentVolume is the PV the volume was published from: its
	// finalizer stays while the entry does (absent in records of older
	// attachers, which are matched by volume handle instead).
	PersistentVolume string `json:"persistentVolume,omitempty"`
	// Uncertain: the publish failed with an unknown outcome, so the
	// driver may still be publishing; a ListVolumes listing that does not
	// show the volume does not forget such an entry.
	Uncertain bool `json:"uncertain,omitempty"`
}

// orphanStore keeps orphaned publications where a restarted attacher
// finds them. Put and Delete are idempotent; Load returns every entry by
// VolumeAttachment name. Delete removes the entry of rec's name only while
// it records the same publication (sameRecord): a newer orphan of that
// name recorded meanwhile keeps its entry.
type orphanStore interface {
	Load(ctx context.Context) (map[string]orphanRecord, error)
	Put(ctx context.Context, rec orphanRecord) error
	Delete(ctx context.Context, rec orphanRecord) error
}

// sameRecord reports whether a and b record the same publication: made for
// the same VolumeAttachment object (UID), volume and node ID, as
// orphan.same.
func sameRecord(a, b orphanRecord) bool {
	return a.UID == b.UID && a.VolumeHandle == b.VolumeHandle && a.NodeID == b.NodeID
}

// configMapOrphanStore is an orphanStore in one ConfigMap, one data key per
// VolumeAttachment name. Writes are serialized and carry the
// resourceVersion last seen, so two writers never overwrite each other's
// entries (only the leader writes; a conflict means a stale view).
type configMapOrphanStore struct {
	client          kubernetes.Interface
	namespace, name string

	mu sync.Mutex
	// cm is the ConfigMap as last read or written; nil when unknown.
	cm *v1.ConfigMap
}

var _ orphanStore = (*configMapOrphanStore)(nil)

func newConfigMapOrphanStore(client kubernetes.Interface, namespace, driver string) *configMapOrphanStore {
	return &configMapOrphanStore{client: client, namespace: namespace, name: OrphanRecordName(driver)}
}

func (s *configMapOrphanStore) String() string { return "ConfigMap " + s.namespace + "/" + s.name }

func (s *configMapOrphanStore) Load(ctx context.Context) (map[string]orphanRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.read(ctx); err != nil {
		return nil, err
	}
	out, invalid := parseRecords(s.cm, s.String())
	if invalid != nil {
		return out, invalid
	}
	return out, nil
}

// parseRecords returns the entries of cm (the record of store) by
// VolumeAttachment name, and the keys of those that are not valid records.
func parseRecords(cm *v1.ConfigMap, store string) (map[string]orphanRecord, *invalidRecordsError) {
	out := map[string]orphanRecord{}
	var invalid *invalidRecordsError
	for _, key := range slices.Sorted(maps.Keys(cm.Data)) {
		var rec orphanRecord
		if err := json.Unmarshal([]byte(cm.Data[key]), &rec); err != nil || rec.VolumeHandle == "" || rec.NodeID == "" {
			if invalid == nil {
				invalid = &invalidRecordsError{store: store}
			}
			invalid.keys = append(invalid.keys, key)
			continue
		}
		rec.VolumeAttachment = key
		out[key] = rec
	}
	return out, invalid
}

// invalidRecordsError is Load's error when entries of the record are not
// valid records (hand-edited, or written by something else): nothing
// tells what they would unpublish. The valid entries are returned beside
// it, so one bad entry does not hold every attach back.
type invalidRecordsError struct {
	store string
	keys  []string
}

func (e *invalidRecordsError) Error() string {
	return fmt.Sprintf("read orphaned publications from %s: entries %q are not valid records (a JSON object with volumeHandle and nodeID); they are ignored", e.store, e.keys)
}

func (s *configMapOrphanStore) Put(ctx context.Context, rec orphanRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.modify(ctx, func(data map[string]string) bool {
		if data[rec.VolumeAttachment] == string(raw) {
			return false
		}
		data[rec.VolumeAttachment] = string(raw)
		return true
	})
}

func (s *configMapOrphanStore) Delete(ctx context.Context, rec orphanRecord) error {
	return s.modify(ctx, func(data map[string]string) bool {
		raw, ok := data[rec.VolumeAttachment]
		if !ok {
			return false
		}
		var cur orphanRecord
		if err := json.Unmarshal([]byte(raw), &cur); err != nil || !sameRecord(cur, rec) {
			// Another orphan of that name (or an entry that is not ours
			// to judge): it stays.
			return false
		}
		delete(data, rec.VolumeAttachment)
		return true
	})
}

// read refreshes s.cm from the API server; a missing ConfigMap is an
// empty one (created by the first Put).
func (s *configMapOrphanStore) read(ctx context.Context) error {
	cm, err := s.client.CoreV1().ConfigMaps(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s.cm = &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: s.name}}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read orphaned publications from %s: %w", s, err)
	}
	s.cm = cm
	return nil
}

// modify applies change to the entries and writes them back, re-reading
// once when the view was stale. A change that finds nothing to do on a
// view kept from an earlier call is checked on a fresh read: another
// writer (an old leader) may have changed the entry meanwhile, and no
// write would tell.
func (s *configMapOrphanStore) modify(ctx context.Context, change func(map[string]string) bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; ; attempt++ {
		fresh := s.cm == nil
		if fresh {
			if err := s.read(ctx); err != nil {
				return err
			}
		}
		cm := s.cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if !change(cm.Data) {
			if fresh || attempt > 0 {
				return nil
			}
			s.cm = nil
			continue
		}
		var written *v1.ConfigMap
		var err error
		if cm.ResourceVersion == "" {
			cm.Labels = map[string]string{"app.kubernetes.io/managed-by": "latch-csi-attacher"}
			written, err = s.client.CoreV1().ConfigMaps(s.namespace).Create(ctx, cm, metav1.CreateOptions{FieldManager: kube.AttacherFieldManager})
		} else {
			written, err = s.client.CoreV1().ConfigMaps(s.namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: kube.AttacherFieldManager})
		}
		if err == nil {
			s.cm = written
			return nil
		}
		s.cm = nil // re-read before the next write
		if attempt == 0 && (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) {
			continue
		}
		return fmt.Errorf("write orphaned publications to %s: %w", s, err)
	}
}

// recordOf and fromRecord convert between the in-memory orphan and its
// durable entry. An entry's secretRef is written (older attachers read
// it) but never read back: the Secret of an unpublish comes from the
// PersistentVolume (decide.RecordedOrphanSecret).
func recordOf(name string, o orphan) orphanRecord {
	rec := orphanRecord{VolumeAttachment: name, UID: o.uid, VolumeHandle: o.handle, NodeID: o.nodeID, NodeName: o.nodeName,
		PersistentVolume: o.pvName, Uncertain: o.uncertain}
	if o.secretRef != nil {
		rec.SecretRef = o.secretRef.Namespace + "/" + o.secretRef.Name
	}
	return rec
}

func fromRecord(rec orphanRecord) orphan {
	return orphan{
		name: rec.VolumeAttachment, uid: rec.UID, handle: rec.VolumeHandle, nodeID: rec.NodeID, nodeName: rec.NodeName,
		pvName: rec.PersistentVolume, uncertain: rec.Uncertain, recorded: true, fromRecord: true,
	}
}

// OrphanNamespace is the namespace of the orphan record when
// Config.OrphanNamespace is not set: the leader election namespace when
// given, else the Pod's namespace (POD_NAMESPACE, else the ServiceAccount's
// namespace file), else "default", where the leader election Lease would
// live too.
func OrphanNamespace(leaderNamespace string) string {
	if leaderNamespace != "" {
		return leaderNamespace
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(ns) > 0 {
		return strings.TrimSpace(string(ns))
	}
	return "default"
}
