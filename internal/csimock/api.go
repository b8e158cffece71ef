package csimock

import (
	"maps"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// This file is the in-process API for tests and benchmarks: inspection,
// fault control and seeding state without going through gRPC.

// Calls returns the call log, oldest first (bounded by Config.CallLogSize).
func (d *Driver) Calls() []Call { return d.calls.calls() }

// CallsTo returns the logged calls of one method, oldest first.
func (d *Driver) CallsTo(method string) []Call {
	method = normalizeMethod(method)
	var out []Call
	for _, c := range d.calls.calls() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// ResetCalls empties the call log and the per-method counters.
func (d *Driver) ResetCalls() { d.calls.reset() }

// Stats is a snapshot of the driver's counters.
type Stats struct {
	// Methods counts calls per RPC name.
	Methods map[string]MethodStats `json:"methods"`
	// DroppedCalls counts calls that fell out of the bounded call log.
	DroppedCalls int64        `json:"droppedCalls"`
	Publish      PublishStats `json:"publish"`
	// Backend is the backend model's counters; nil when none is set.
	Backend *BackendStats `json:"backend,omitempty"`
}

// Stats returns the driver's counters.
func (d *Driver) Stats() Stats {
	methods, dropped := d.calls.methodStats()
	s := Stats{Methods: methods, DroppedCalls: dropped, Publish: d.state.publishStats()}
	if b, ok := d.BackendStats(); ok {
		s.Backend = &b
	}
	return s
}

// PublishCount is the number of successful ControllerPublishVolume calls
// for the pair, idempotent repeats included.
func (d *Driver) PublishCount(volumeID, nodeID string) int64 {
	return d.state.pairPublishes(volumeID, nodeID)
}

// Published returns the sorted node IDs volumeID is published to.
func (d *Driver) Published(volumeID string) []string { return d.state.published(volumeID) }

// AddFault installs a rule and returns its ID.
func (d *Driver) AddFault(r Rule) (string, error) { return d.faults.add(r) }

// ReleaseHang removes hang rule id and lets every call it holds go on
// (see Rule.Hang); false if there is no such rule.
func (d *Driver) ReleaseHang(id string) bool { return d.faults.releaseHang(id) }

// RemoveFault removes a rule; it reports whether the rule existed.
func (d *Driver) RemoveFault(id string) bool { return d.faults.remove(id) }

// ClearFaults removes every rule.
func (d *Driver) ClearFaults() { d.faults.clear() }

// Faults lists the rules in evaluation order with their counters.
func (d *Driver) Faults() []RuleStatus { return d.faults.list() }

// SetExtraPublishContext adds pc to the publish context of every later
// ControllerPublishVolume response (new and repeated publications alike),
// without storing it with the publication; nil stops it. Tests use it to
// return a publish context larger than a VolumeAttachment can hold.
func (d *Driver) SetExtraPublishContext(pc map[string]string) {
	if pc == nil {
		d.extraPublishContext.Store(nil)
		return
	}
	c := maps.Clone(pc)
	d.extraPublishContext.Store(&c)
}

// SetKnownNodes replaces the set of node IDs publish accepts; nil accepts
// any node ID. Unlike Config.KnownNodes, the node service's NodeID is not
// added implicitly, so a test can also make that node "disappear".
func (d *Driver) SetKnownNodes(nodes []string) { d.state.setKnownNodes(nodes) }

// VolumeSpec seeds a volume directly into the backend.
type VolumeSpec struct {
	// ID is required.
	ID string
	// Name is optional; a later CreateVolume with this name returns it.
	Name          string
	CapacityBytes int64
	Parameters    map[string]string
}

// SeedVolume adds a volume as if it had been provisioned earlier. Seeding
// an existing ID is an AlreadyExists error.
func (d *Driver) SeedVolume(v VolumeSpec) error {
	if v.ID == "" {
		return status.Error(codes.InvalidArgument, "volume ID is required")
	}
	s := d.state
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.volumes[v.ID]; ok {
		return status.Errorf(codes.AlreadyExists, "volume %q already exists", v.ID)
	}
	if _, ok := s.byName[v.Name]; ok && v.Name != "" {
		return status.Errorf(codes.AlreadyExists, "volume name %q already exists", v.Name)
	}
	s.addVolumeLocked(&volume{
		ID: v.ID, Name: v.Name, CapacityBytes: v.CapacityBytes,
		Parameters: maps.Clone(v.Parameters), Published: map[string]*publication{},
	})
	return nil
}

// SeedPublication publishes a volume to a node through the normal
// decision (so it can fail the same way), without a gRPC call. Useful to
// start a test from "the driver already has it attached".
func (d *Driver) SeedPublication(volumeID, nodeID string, readonly bool, capability *csi.VolumeCapability) (map[string]string, error) {
	a := publishArgs{VolumeID: volumeID, NodeID: nodeID, Readonly: readonly, Capability: capability}
	if err := validatePublish(a, d.cfg.Capabilities); err != nil {
		return nil, err
	}
	return d.state.publish(callRef{}, a, &d.cfg)
}

// PublicationState is one publication in a State snapshot.
type PublicationState struct {
	NodeID         string            `json:"nodeID"`
	Readonly       bool              `json:"readonly"`
	AccessMode     string            `json:"accessMode"`
	AccessType     string            `json:"accessType"`
	PublishContext map[string]string `json:"publishContext"`
}

// VolumeState is one volume in a State snapshot.
type VolumeState struct {
	ID            string             `json:"id"`
	Name          string             `json:"name,omitempty"`
	CapacityBytes int64              `json:"capacityBytes"`
	Published     []PublicationState `json:"published"`
}

// State is a consistent snapshot of the backend.
type State struct {
	Serving bool          `json:"serving"`
	Ready   bool          `json:"ready"`
	Volumes []VolumeState `json:"volumes"`
	// NodeVolumes is the number of volumes published per node.
	NodeVolumes map[string]int64 `json:"nodeVolumes"`
	// KnownNodes is nil when any node ID is accepted.
	KnownNodes []string `json:"knownNodes"`
	// Nodes are the node-service volumes of every node that has any
	// staged or published, by node ID.
	Nodes map[string]NodeVolumes `json:"nodes"`
}

// State returns a snapshot of volumes and publications, sorted by ID.
func (d *Driver) State() State {
	out := State{Serving: d.Serving(), Ready: d.Ready(), Nodes: d.nodeSnapshots()}
	s := d.state
	s.mu.Lock()
	defer s.mu.Unlock()
	out.NodeVolumes = maps.Clone(s.nodeCounts)
	if s.knownNodes != nil {
		out.KnownNodes = make([]string, 0, len(s.knownNodes))
		for n := range s.knownNodes {
			out.KnownNodes = append(out.KnownNodes, n)
		}
		sort.Strings(out.KnownNodes)
	}
	for _, v := range s.volumes {
		vs := VolumeState{ID: v.ID, Name: v.Name, CapacityBytes: v.CapacityBytes, Published: []PublicationState{}}
		for _, n := range sortedNodes(v) {
			p := v.Published[n]
			accessType := "mount"
			if p.Capability.GetBlock() != nil {
				accessType = "block"
			}
			vs.Published = append(vs.Published, PublicationState{
				NodeID: n, Readonly: p.Readonly,
				AccessMode:     p.Capability.GetAccessMode().GetMode().String(),
				AccessType:     accessType,
				PublishContext: maps.Clone(p.PublishContext),
			})
		}
		out.Volumes = append(out.Volumes, vs)
	}
	sort.Slice(out.Volumes, func(i, j int) bool { return out.Volumes[i].ID < out.Volumes[j].ID })
	return out
}
