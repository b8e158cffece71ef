package kube

import (
	"encoding/json"
	"fmt"
	"reflect"

	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// VolumeAttachmentStatusPatch returns a JSON merge patch (RFC 7386, send it
// with types.MergePatchType to the "status" subresource) that turns
// va.Status into want, or nil when they are already semantically equal.
//
// Only the fields that differ are sent, with explicit nulls for cleared
// fields and removed attachmentMetadata keys, so the patch does not fight
// over fields it does not mean to change. The patch carries metadata.uid
// when va has one: the API server refuses to apply it to a different object
// that reuses the name (a VolumeAttachment deleted and re-created while we
// worked from the cache), which is the lost update that matters here. It
// deliberately carries no resourceVersion: csi-attacher is the only writer
// of VolumeAttachment status, and a status write after a successful
// ControllerPublish must not be lost to an unrelated metadata change.
func VolumeAttachmentStatusPatch(va *storagev1.VolumeAttachment, want storagev1.VolumeAttachmentStatus) ([]byte, error) {
	if apiequality.Semantic.DeepEqual(va.Status, want) {
		return nil, nil
	}
	oldMap, err := toJSONMap(va.Status)
	if err != nil {
		return nil, fmt.Errorf("build status patch for VolumeAttachment %q: %w", va.Name, err)
	}
	newMap, err := toJSONMap(want)
	if err != nil {
		return nil, fmt.Errorf("build status patch for VolumeAttachment %q: %w", va.Name, err)
	}
	diff := mergeDiff(oldMap, newMap)
	if len(diff) == 0 {
		// Semantically different but identical on the wire (e.g. time
		// precision below a second): nothing the server could store.
		return nil, nil
	}
	patch := map[string]any{"status": diff}
	if va.UID != "" {
		patch["metadata"] = map[string]any{"uid": string(va.UID)}
	}
	return json.Marshal(patch)
}

func toJSONMap(v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// mergeDiff returns the RFC 7386 merge patch that turns old into new:
// removed keys map to nil (JSON null), nested objects are diffed
// recursively, everything else is replaced whole.
func mergeDiff(old, new map[string]any) map[string]any {
	diff := map[string]any{}
	for k := range old {
		if _, ok := new[k]; !ok {
			diff[k] = nil
		}
	}
	for k, nv := range new {
		ov, ok := old[k]
		if !ok {
			diff[k] = nv
			continue
		}
		om, oIsMap := ov.(map[string]any)
		nm, nIsMap := nv.(map[string]any)
		if oIsMap && nIsMap {
			if d := mergeDiff(om, nm); len(d) > 0 {
				diff[k] = d
			}
			continue
		}
		if !reflect.DeepEqual(ov, nv) {
			diff[k] = nv
		}
	}
	return diff
}
