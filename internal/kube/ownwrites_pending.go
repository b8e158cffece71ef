package kube

import (
	"encoding/json"
	"reflect"
	"slices"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// pendingWrite is a patch of ours whose call has not returned. The API
// server may have applied it already, and the informer may deliver the
// new version before the call returns (it often does: the watch event and
// the response leave the server together, and the response still has to
// be decoded): the resourceVersion the write produced is not known yet,
// so its echo is recognised by what was written instead. The patch is
// applied to the version the event replaced, which must be the very
// version the patch was sent against (before); the event is ours when
// the result is the version it delivers, apart from the resourceVersion
// and managed fields. Another client's write in between changes something
// else (or makes a guarded JSON patch fail to apply), so it is never taken
// for ours; a client writing exactly what we wrote, on exactly that
// version, leaves the object as our pass meant it, so nothing follows
// from it either.
type pendingWrite struct {
	name, before string
	patchType    types.PatchType
	patch        []byte
	// echoed is the resourceVersion of the event recognised as this
	// write's echo ("" while none was).
	echoed string
}

// Patch sends one patch of obj (send) with the overlay told beforehand:
// from just before the call until its answer is recorded, the informer's
// event of the version it produces is recognised as ours (IsOwnUpdate),
// whichever comes first. The answer is recorded as Record does; a failed
// call withdraws the expectation. patch must be a JSON patch or a JSON
// merge patch (any other type is sent, only its early echo is not
// recognised).
func (s *OverlaidStore[T]) Patch(obj T, pt types.PatchType, patch []byte, send func() (T, error)) (T, error) {
	p := &pendingWrite{name: obj.GetName(), before: obj.GetResourceVersion(), patchType: pt, patch: patch}
	s.mu.Lock()
	s.pending[p.name] = append(s.pending[p.name], p)
	s.mu.Unlock()

	// The expectation ends with the call, even one that panics.
	ended := false
	defer func() {
		if !ended {
			s.mu.Lock()
			s.withdrawLocked(p)
			s.mu.Unlock()
		}
	}()
	written, err := send()

	// One lock from the withdrawal to the record: an event handled in
	// between would find neither.
	s.mu.Lock()
	ended = true
	s.withdrawLocked(p)
	if err != nil || p.echoed != "" && p.echoed == written.GetResourceVersion() {
		// A failed call is withdrawn. An echo delivered before the call
		// returned was handled as ours, and the cache holds it: nothing
		// is left to overlay.
		s.mu.Unlock()
		return written, err
	}
	s.recordLocked(p.before, written)
	s.mu.Unlock()
	s.forgetDeleted(s.store, written)
	return written, nil
}

// withdrawLocked drops the expectation p.
func (w *OwnWrites[T]) withdrawLocked(p *pendingWrite) {
	w.pending[p.name] = slices.DeleteFunc(w.pending[p.name], func(q *pendingWrite) bool { return q == p })
	if len(w.pending[p.name]) == 0 {
		delete(w.pending, p.name)
	}
}

// IsOwnUpdate reports whether the informer's update from old to obj is a
// write of ours, recorded (IsOwn) or still in flight (Patch): its event
// needs no pass. old is the version the informer held before (the zero
// value for an add).
func (w *OwnWrites[T]) IsOwnUpdate(old, obj T) bool {
	if w.IsOwn(obj) {
		return true
	}
	if reflect.ValueOf(old).IsNil() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.pending[obj.GetName()] {
		if p.echoed == "" && p.before == old.GetResourceVersion() && old.GetUID() == obj.GetUID() &&
			patchedTo(old, obj, p.patchType, p.patch) {
			p.echoed = obj.GetResourceVersion()
			return true
		}
	}
	return false
}

// patchedTo reports whether patch (of type pt) applied to old gives obj,
// resourceVersion and managed fields apart.
func patchedTo[T Object](old, obj T, pt types.PatchType, patch []byte) bool {
	doc, err := json.Marshal(old)
	if err != nil {
		return false
	}
	switch pt {
	case types.JSONPatchType:
		ops, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			return false
		}
		// A failing "test" (the guard of a patch we send) fails here too.
		if doc, err = ops.Apply(doc); err != nil {
			return false
		}
	case types.MergePatchType:
		if doc, err = jsonpatch.MergePatch(doc, patch); err != nil {
			return false
		}
	default:
		return false
	}
	want := reflect.New(reflect.TypeOf(old).Elem()).Interface().(T)
	if err := json.Unmarshal(doc, want); err != nil {
		return false
	}
	// resourceVersion and managed fields apart: want takes obj's, so
	// obj, the informer's object, is compared as it is, without a copy.
	want.SetResourceVersion(obj.GetResourceVersion())
	want.SetManagedFields(obj.GetManagedFields())
	return equality.Semantic.DeepEqual(want, obj)
}
