// Package attachdetach is latch's replacement for kube-controller-manager's
// attach/detach controller, for CSI volumes.
//
// The pure core lives in subpackages so that each can be tested on its own
// and the I/O wiring (informers, work queues, the executor that creates and
// deletes VolumeAttachments, the node status updater) stays thin:
//
//   - volume: resolves a Pod volume (PVC → PV, inline, CSI migration) into
//     an attachable CSI volume, or says why it is not one (yet).
//   - state: the desired state of the world (which pods want which volume
//     on which node) and the actual state (what is attached, attaching,
//     uncertain or detaching), keyed by unique volume name and node.
//   - decide: the reconcile decision for one (volume, node) key, a pure
//     function from observed facts to a Plan the executor carries out.
//   - nodestatus: the Node.status.volumesAttached list the ASW implies, and
//     whether the node needs a write at all.
//
// The controller is event-driven: a change to a Pod, Node, PVC, PV,
// CSIDriver, CSINode (its migrated-plugins annotation, with per-node CSI
// migration) or VolumeAttachment enqueues the (volume, node) keys it affects;
// a worker gathers the facts for one key, calls decide.Decide and executes
// the plan. Timers (the unmount timeout) come back as Plan.RequeueAfter.
package attachdetach
