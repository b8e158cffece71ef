package attacher

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube"
)

// metadataPatch merges a finalizer patch and an annotation patch into one
// guarded JSON patch, so attach costs one metadata write instead of two.
// Both halves come from internal/kube and test the same resourceVersion;
// the second test is dropped.
func metadataPatch(obj metav1.Object, mc *decide.MetadataChange) ([]byte, error) {
	var ops []json.RawMessage
	add := func(patch []byte, err error) error {
		if err != nil || patch == nil {
			return err
		}
		var part []json.RawMessage
		if err := json.Unmarshal(patch, &part); err != nil {
			return fmt.Errorf("merge metadata patches: %w", err)
		}
		if len(ops) > 0 {
			part = part[1:] // the resourceVersion test is already there
		}
		ops = append(ops, part...)
		return nil
	}
	if mc.AddFinalizer != "" {
		if err := add(kube.AddFinalizerPatch(obj, mc.AddFinalizer)); err != nil {
			return nil, err
		}
	}
	if len(mc.SetAnnotations) > 0 {
		if err := add(kube.SetAnnotationsPatch(obj, mc.SetAnnotations)); err != nil {
			return nil, err
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}
