package csimock

import (
	"sort"
)

// maxRecordedEvents bounds the lists of single-node events so a driver
// hammered by a buggy controller does not grow without limit; the counters
// keep counting.
const maxRecordedEvents = 1000

// SingleNodeEvent is a single-node volume seen on (or requested for) more
// than one node.
type SingleNodeEvent struct {
	VolumeID string `json:"volumeID"`
	// NodeID is the node the publish asked for.
	NodeID string `json:"nodeID"`
	// OtherNodes are the nodes the volume was already published to.
	OtherNodes []string `json:"otherNodes"`
}

// PairStat counts successful ControllerPublishVolume calls for one
// volume/node pair, idempotent repeats included.
type PairStat struct {
	VolumeID  string `json:"volumeID"`
	NodeID    string `json:"nodeID"`
	Publishes int64  `json:"publishes"`
}

// PublishStats is what the backend observed about publishing.
type PublishStats struct {
	// Pairs is sorted by volume, then node.
	Pairs []PairStat `json:"pairs"`
	// DuplicatePublishes counts successful publishes of a pair that was
	// already published: each one is a publish the controller did not need.
	DuplicatePublishes int64 `json:"duplicatePublishes"`
	// MaxSingleNodePublishedNodes is the largest number of nodes any volume
	// with a single-node publication was published to at once. Anything
	// above 1 is a multi-attach.
	MaxSingleNodePublishedNodes int `json:"maxSingleNodePublishedNodes"`
	// SingleNodeViolations are publishes that left a single-node volume on
	// two nodes at once (only possible with SkipSingleNodeCheck).
	SingleNodeViolations      []SingleNodeEvent `json:"singleNodeViolations"`
	SingleNodeViolationsTotal int64             `json:"singleNodeViolationsTotal"`
	// SingleNodeConflictAttempts are publishes rejected with
	// FailedPrecondition because the volume was published elsewhere.
	SingleNodeConflictAttempts      []SingleNodeEvent `json:"singleNodeConflictAttempts"`
	SingleNodeConflictAttemptsTotal int64             `json:"singleNodeConflictAttemptsTotal"`
}

// publishStats is guarded by store.mu.
type publishStats struct {
	pairs      map[pairKey]int64
	duplicates int64
	maxNodes   int
	violations []SingleNodeEvent
	violTotal  int64
	attempts   []SingleNodeEvent
	attTotal   int64
}

func newPublishStats() publishStats {
	return publishStats{pairs: map[pairKey]int64{}}
}

func (p *publishStats) recordPublish(k pairKey, duplicate bool) {
	p.pairs[k]++
	if duplicate {
		p.duplicates++
	}
}

func (p *publishStats) recordConflictAttempt(a publishArgs, others []*publication) {
	p.attTotal++
	if len(p.attempts) < maxRecordedEvents {
		p.attempts = append(p.attempts, SingleNodeEvent{VolumeID: a.VolumeID, NodeID: a.NodeID, OtherNodes: nodeIDs(others)})
	}
}

// observeVolume runs after a new publication: it checks, independently of
// the decision that allowed it, whether a single-node volume is now on two
// nodes. O(publications of this volume).
func (p *publishStats) observeVolume(v *volume) {
	single := false
	for _, pub := range v.Published {
		if isSingleNode(pub.Capability.GetAccessMode().GetMode()) {
			single = true
			break
		}
	}
	if !single {
		return
	}
	n := len(v.Published)
	if n > p.maxNodes {
		p.maxNodes = n
	}
	if n < 2 {
		return
	}
	p.violTotal++
	if len(p.violations) < maxRecordedEvents {
		nodes := sortedNodes(v)
		p.violations = append(p.violations, SingleNodeEvent{VolumeID: v.ID, NodeID: nodes[len(nodes)-1], OtherNodes: nodes[:len(nodes)-1]})
	}
}

func nodeIDs(pubs []*publication) []string {
	out := make([]string, 0, len(pubs))
	for _, p := range pubs {
		out = append(out, p.NodeID)
	}
	sort.Strings(out)
	return out
}

func (s *store) publishStats() PublishStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := &s.stats
	out := PublishStats{
		Pairs:                           make([]PairStat, 0, len(p.pairs)),
		DuplicatePublishes:              p.duplicates,
		MaxSingleNodePublishedNodes:     p.maxNodes,
		SingleNodeViolations:            append([]SingleNodeEvent(nil), p.violations...),
		SingleNodeViolationsTotal:       p.violTotal,
		SingleNodeConflictAttempts:      append([]SingleNodeEvent(nil), p.attempts...),
		SingleNodeConflictAttemptsTotal: p.attTotal,
	}
	for k, n := range p.pairs {
		out.Pairs = append(out.Pairs, PairStat{VolumeID: k.volumeID, NodeID: k.nodeID, Publishes: n})
	}
	sort.Slice(out.Pairs, func(i, j int) bool {
		if out.Pairs[i].VolumeID != out.Pairs[j].VolumeID {
			return out.Pairs[i].VolumeID < out.Pairs[j].VolumeID
		}
		return out.Pairs[i].NodeID < out.Pairs[j].NodeID
	})
	return out
}

func (s *store) pairPublishes(volumeID, nodeID string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.pairs[pairKey{volumeID, nodeID}]
}
