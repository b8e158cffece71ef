package state

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// PodRecord is what the controller last recorded for a Pod.
type PodRecord struct {
	UID  types.UID
	Node string
	// Volumes are the pod volumes that resolved to an attachable, in pod
	// spec order (a slice, not a map: a Pod has one or a few, and a map's
	// smallest table holds eight entries).
	Volumes []PodVolume
	// Scheduled is when the Pod was bound to its node (PodScheduled
	// condition, else its creation), for the attach latency metric.
	Scheduled time.Time
	// Warned holds pod volumes already reported as unsupported.
	Warned map[string]bool
}

// PodVolume is one pod volume and the attachable it resolved to.
type PodVolume struct {
	Name   string
	Volume volume.Attachable
}

// Volume returns what the pod volume name resolved to.
func (r PodRecord) Volume(name string) (volume.Attachable, bool) {
	for _, v := range r.Volumes {
		if v.Name == name {
			return v.Volume, true
		}
	}
	return volume.Attachable{}, false
}

// Pods indexes, per "namespace/name" (PodKey), what each Pod was
// recorded with, so that a deleted Pod (gone from the lister) can be
// removed from the desired state and a volume that stops resolving (its
// PVC deleted while in use) stays wanted until the Pod goes, as upstream
// keeps it.
type Pods struct {
	mu   sync.Mutex
	pods map[string]PodRecord
}

// NewPods returns an empty index.
func NewPods() *Pods { return &Pods{pods: map[string]PodRecord{}} }

// PodKey is the index key of a Pod: "namespace/name".
func PodKey(namespace, name string) string { return namespace + "/" + name }

// Get returns the record of the Pod key.
func (p *Pods) Get(key string) (PodRecord, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.pods[key]
	return r, ok
}

// Set records r for the Pod key.
func (p *Pods) Set(key string, r PodRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods[key] = r
}

// Forget drops the record of the Pod key.
func (p *Pods) Forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pods, key)
}
