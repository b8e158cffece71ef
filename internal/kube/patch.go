package kube

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Patch builders.
//
// Every builder returns (nil, nil) when the object already is in the wanted
// state: callers must check for a nil patch and skip the API call, because a
// no-op write still costs an API round trip, bumps nothing but wakes every
// watcher's informer in some versions, and hides bugs in the decision code.
//
// Finalizer and annotation patches are RFC 6902 JSON patches (send them with
// types.JSONPatchType) that start with a "test" of metadata.resourceVersion
// (RemoveFinalizerPatch tests metadata.finalizers instead, see there).
// When the object changed since it was read, the API server rejects the
// whole patch with 422 Unprocessable Entity (apierrors.IsInvalid, message
// "testing value /metadata/resourceVersion failed"), so a patch built from a
// stale cache can never silently overwrite a concurrent change to the
// finalizer list. The caller re-reads and retries through its normal
// backoff; it must not treat that 422 as a permanent validation failure.

// jsonPatchOp is one RFC 6902 operation. Value uses omitempty on an
// interface, which only drops a nil interface: an empty string or an empty
// list is still sent.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

func resourceVersionTest(obj metav1.Object) (jsonPatchOp, error) {
	rv := obj.GetResourceVersion()
	if rv == "" {
		// Without a resourceVersion there is no precondition; refuse rather
		// than send an unguarded list replacement.
		return jsonPatchOp{}, fmt.Errorf("object %q has no resourceVersion to use as patch precondition", objectName(obj))
	}
	return jsonPatchOp{Op: "test", Path: "/metadata/resourceVersion", Value: rv}, nil
}

func objectName(obj metav1.Object) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// AddFinalizerPatch returns a JSON patch that adds finalizer to obj, guarded
// by obj's resourceVersion, or nil when obj already has it. The whole list
// is written (not appended with "/-") so the patch also works when the
// object has no finalizers field at all; the resourceVersion test makes
// that safe.
func AddFinalizerPatch(obj metav1.Object, finalizer string) ([]byte, error) {
	current := obj.GetFinalizers()
	if slices.Contains(current, finalizer) {
		return nil, nil
	}
	want := append(slices.Clone(current), finalizer)
	return finalizersPatch(obj, want)
}

// RemoveFinalizerPatch returns a JSON patch that removes every occurrence of
// finalizer from obj, guarded by a test of obj's current finalizer list, or
// nil when obj does not have it.
func RemoveFinalizerPatch(obj metav1.Object, finalizer string) ([]byte, error) {
	current := obj.GetFinalizers()
	if !slices.Contains(current, finalizer) {
		return nil, nil
	}
	want := slices.DeleteFunc(slices.Clone(current), func(f string) bool { return f == finalizer })
	if want == nil {
		want = []string{}
	}
	// Guarded by the finalizer list itself rather than the resourceVersion:
	// a concurrent change to the finalizers still fails the test (nothing is
	// overwritten), but writers that touch anything else — labels,
	// annotations, status — cannot starve the removal that ends a detach.
	return json.Marshal([]jsonPatchOp{
		{Op: "test", Path: "/metadata/finalizers", Value: current},
		{Op: "replace", Path: "/metadata/finalizers", Value: want},
	})
}

func finalizersPatch(obj metav1.Object, want []string) ([]byte, error) {
	test, err := resourceVersionTest(obj)
	if err != nil {
		return nil, fmt.Errorf("build finalizer patch: %w", err)
	}
	if want == nil {
		want = []string{}
	}
	return json.Marshal([]jsonPatchOp{
		test,
		{Op: "add", Path: "/metadata/finalizers", Value: want},
	})
}

// SetAnnotationsPatch returns a JSON patch that sets every key of set to its
// value on obj, guarded by obj's resourceVersion, or nil when all of them
// already have that value. Other annotations are left alone.
func SetAnnotationsPatch(obj metav1.Object, set map[string]string) ([]byte, error) {
	current := obj.GetAnnotations()
	var changed []string
	for k, v := range set {
		if cur, ok := current[k]; !ok || cur != v {
			changed = append(changed, k)
		}
	}
	if len(changed) == 0 {
		return nil, nil
	}
	slices.Sort(changed) // deterministic patches make tests and audit logs readable
	test, err := resourceVersionTest(obj)
	if err != nil {
		return nil, fmt.Errorf("build annotation patch: %w", err)
	}
	ops := []jsonPatchOp{test}
	if len(current) == 0 {
		// "add" to a member of a missing map fails, and an empty map is
		// not stored by the server; create the map whole.
		all := make(map[string]string, len(changed))
		for _, k := range changed {
			all[k] = set[k]
		}
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: all})
	} else {
		for _, k := range changed {
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + escapeJSONPointer(k), Value: set[k]})
		}
	}
	return json.Marshal(ops)
}

// RemoveAnnotationsPatch returns a JSON patch that removes the given
// annotation keys from obj, guarded by obj's resourceVersion, or nil when
// none of them is present.
func RemoveAnnotationsPatch(obj metav1.Object, keys ...string) ([]byte, error) {
	current := obj.GetAnnotations()
	var present []string
	for _, k := range keys {
		if _, ok := current[k]; ok {
			present = append(present, k)
		}
	}
	if len(present) == 0 {
		return nil, nil
	}
	slices.Sort(present)
	present = slices.Compact(present)
	test, err := resourceVersionTest(obj)
	if err != nil {
		return nil, fmt.Errorf("build annotation patch: %w", err)
	}
	ops := []jsonPatchOp{test}
	for _, k := range present {
		ops = append(ops, jsonPatchOp{Op: "remove", Path: "/metadata/annotations/" + escapeJSONPointer(k)})
	}
	return json.Marshal(ops)
}

// escapeJSONPointer escapes one reference token (RFC 6901): annotation keys
// routinely contain '/', which would otherwise be read as a path separator.
func escapeJSONPointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
