package csimock

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"sort"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// volume is the backend's record of one volume.
type volume struct {
	ID            string
	Name          string
	CapacityBytes int64
	Parameters    map[string]string
	// Published is keyed by node ID.
	Published map[string]*publication
}

// publication is one volume published to one node.
type publication struct {
	NodeID         string
	Readonly       bool
	Capability     *csi.VolumeCapability
	PublishContext map[string]string
}

type pairKey struct{ volumeID, nodeID string }

// store is the backend: volumes, publications and per-node counts. Every
// operation on the publish path is O(1) in the number of volumes; only
// ListVolumes and snapshots walk everything.
//
// Mutations carry the epoch of the serving instance that accepted the call.
// Crash bumps the epoch, so a handler still running after a crash cannot
// change state any more, as a killed process could not.
type store struct {
	mu sync.Mutex

	epoch   uint64
	volumes map[string]*volume // by ID
	byName  map[string]string  // volume name → ID
	// nodeCounts is the number of volumes published per node; kept so the
	// attach limit needs no scan.
	nodeCounts map[string]int64
	// knownNodes is nil when any node ID is accepted.
	knownNodes map[string]bool
	// nodeLimits are per-node attach limits (NodeConfig.MaxVolumes) that
	// replace Config.MaxVolumesPerNode for their node.
	nodeLimits map[string]int64
	deviceSeq  uint64

	// inflight maps a call ID to the publications it created that the
	// caller has not been told about yet; Crash(keepState=false) undoes them.
	inflight map[uint64][]pairKey

	// sortedIDs caches the volume IDs in order for ListVolumes paging; nil
	// when a create or delete made it stale.
	sortedIDs []string

	stats publishStats
}

func newStore(cfg *Config) *store {
	s := &store{
		volumes:    map[string]*volume{},
		byName:     map[string]string{},
		nodeCounts: map[string]int64{},
		nodeLimits: map[string]int64{},
		inflight:   map[uint64][]pairKey{},
		stats:      newPublishStats(),
	}
	if len(cfg.KnownNodes) > 0 {
		s.knownNodes = map[string]bool{}
		for _, n := range cfg.KnownNodes {
			s.knownNodes[n] = true
		}
		if cfg.NodeID != "" {
			s.knownNodes[cfg.NodeID] = true
		}
	}
	return s
}

// callRef identifies the call a mutation belongs to. The zero value is used
// by the in-process seeding helpers, which are never fenced or rolled back.
type callRef struct {
	id    uint64
	epoch uint64
	// fenced is false for direct in-process calls.
	fenced bool
}

var errCrashed = status.Error(codes.Unavailable, "driver crashed while the call was in flight")

// checkEpochLocked fences out handlers of a crashed instance.
func (s *store) checkEpochLocked(c callRef) error {
	if c.fenced && c.epoch != s.epoch {
		return errCrashed
	}
	return nil
}

func (s *store) currentEpoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// volumeIDForName derives a stable ID from the name, so a repeated create
// after a lost reply, or after a restart, yields the same ID.
func volumeIDForName(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "mockvol-" + hex.EncodeToString(sum[:8])
}

func (s *store) createVolume(c callRef, a createArgs) (*volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkEpochLocked(c); err != nil {
		return nil, err
	}
	if id, ok := s.byName[a.Name]; ok {
		v := s.volumes[id]
		if err := createCompatible(v, a); err != nil {
			return nil, err
		}
		return v, nil
	}
	v := &volume{
		ID:            volumeIDForName(a.Name),
		Name:          a.Name,
		CapacityBytes: capacityFor(a),
		Parameters:    maps.Clone(a.Parameters),
		Published:     map[string]*publication{},
	}
	if _, taken := s.volumes[v.ID]; taken {
		// Only possible when a seeded volume used this ID explicitly.
		return nil, status.Errorf(codes.AlreadyExists, "volume ID %q for name %q is taken", v.ID, a.Name)
	}
	s.addVolumeLocked(v)
	return v, nil
}

func (s *store) addVolumeLocked(v *volume) {
	s.volumes[v.ID] = v
	if v.Name != "" {
		s.byName[v.Name] = v.ID
	}
	s.sortedIDs = nil
}

func (s *store) deleteVolume(c callRef, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkEpochLocked(c); err != nil {
		return err
	}
	v, ok := s.volumes[id]
	if !ok {
		return nil // DeleteVolume is idempotent: gone is success.
	}
	if len(v.Published) > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %q is still published to node(s) %v", id, sortedNodes(v))
	}
	delete(s.volumes, id)
	if v.Name != "" {
		delete(s.byName, v.Name)
	}
	s.sortedIDs = nil
	return nil
}

func (s *store) nodeKnownLocked(node string) bool {
	return s.knownNodes == nil || s.knownNodes[node]
}

// publish applies decidePublish. It returns the publish context.
func (s *store) publish(c callRef, a publishArgs, cfg *Config) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkEpochLocked(c); err != nil {
		return nil, err
	}
	v := s.volumes[a.VolumeID]
	view := publishView{
		VolumeExists:        v != nil,
		AutoCreate:          cfg.AutoCreateVolumes,
		NodeKnown:           s.nodeKnownLocked(a.NodeID),
		NodeCount:           s.nodeCounts[a.NodeID],
		MaxVolumesPerNode:   s.maxVolumesLocked(a.NodeID, cfg),
		SkipSingleNodeCheck: cfg.SkipSingleNodeCheck,
	}
	if v != nil {
		view.Existing = v.Published[a.NodeID]
		for n, p := range v.Published {
			if n != a.NodeID {
				view.Others = append(view.Others, p)
			}
		}
	}
	verdict, err := decidePublish(a, view)
	key := pairKey{a.VolumeID, a.NodeID}
	switch verdict {
	case publishReject:
		if status.Code(err) == codes.FailedPrecondition {
			s.stats.recordConflictAttempt(a, view.Others)
		}
		return nil, err
	case publishAgain:
		s.stats.recordPublish(key, true)
		return maps.Clone(view.Existing.PublishContext), nil
	}
	if v == nil {
		// Auto-create: the unknown ID becomes a volume of unknown size.
		v = &volume{ID: a.VolumeID, Published: map[string]*publication{}}
		s.addVolumeLocked(v)
	}
	s.deviceSeq++
	p := &publication{
		NodeID:         a.NodeID,
		Readonly:       a.Readonly,
		Capability:     a.Capability,
		PublishContext: map[string]string{"devicePath": devicePath(s.deviceSeq)},
	}
	v.Published[a.NodeID] = p
	s.nodeCounts[a.NodeID]++
	if c.fenced {
		s.inflight[c.id] = append(s.inflight[c.id], key)
	}
	s.stats.recordPublish(key, false)
	s.stats.observeVolume(v)
	return maps.Clone(p.PublishContext), nil
}

// unpublish removes the publication on node, or on every node when node is
// empty (as the spec requires). Unknown volumes and publications succeed:
// the volume can be regarded as unpublished.
func (s *store) unpublish(c callRef, volumeID, node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkEpochLocked(c); err != nil {
		return err
	}
	v := s.volumes[volumeID]
	if v == nil {
		return nil
	}
	if node != "" {
		s.removePublicationLocked(v, node)
		return nil
	}
	for n := range v.Published {
		s.removePublicationLocked(v, n)
	}
	return nil
}

func (s *store) removePublicationLocked(v *volume, node string) {
	if _, ok := v.Published[node]; !ok {
		return
	}
	delete(v.Published, node)
	s.nodeCounts[node]--
	if s.nodeCounts[node] <= 0 {
		delete(s.nodeCounts, node)
	}
}

// callDone forgets the in-flight bookkeeping of a call whose reply (or
// error) has been handed to gRPC.
func (s *store) callDone(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, id)
}

// crash fences out all running handlers. Unless keepState, publications
// made by calls that had not returned are rolled back: the backend never
// persisted them.
func (s *store) crash(keepState bool) (rolledBack int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	if !keepState {
		for _, keys := range s.inflight {
			for _, k := range keys {
				if v := s.volumes[k.volumeID]; v != nil {
					if _, ok := v.Published[k.nodeID]; ok {
						s.removePublicationLocked(v, k.nodeID)
						rolledBack++
					}
				}
			}
		}
	}
	s.inflight = map[uint64][]pairKey{}
	return rolledBack
}

func (s *store) volumeExists(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.volumes[id]
	return ok
}

func (s *store) isPublishedTo(volumeID, node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.volumes[volumeID]
	return v != nil && v.Published[node] != nil
}

func (s *store) published(volumeID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.volumes[volumeID]
	if v == nil {
		return nil
	}
	return sortedNodes(v)
}

func sortedNodes(v *volume) []string {
	out := make([]string, 0, len(v.Published))
	for n := range v.Published {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// maxVolumesLocked is node's attach limit: its NodeConfig.MaxVolumes,
// else Config.MaxVolumesPerNode (0: unlimited).
func (s *store) maxVolumesLocked(node string, cfg *Config) int64 {
	if n, ok := s.nodeLimits[node]; ok {
		return n
	}
	return cfg.MaxVolumesPerNode
}

// maxVolumes is maxVolumesLocked under the store's lock.
func (s *store) maxVolumes(node string, cfg *Config) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxVolumesLocked(node, cfg)
}

// setNodeLimit gives node an attach limit of its own.
func (s *store) setNodeLimit(node string, max int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeLimits[node] = max
}

// setKnownNodes replaces the known-node set; nil accepts any node ID.
func (s *store) setKnownNodes(nodes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if nodes == nil {
		s.knownNodes = nil
		return
	}
	s.knownNodes = make(map[string]bool, len(nodes))
	for _, n := range nodes {
		s.knownNodes[n] = true
	}
}
