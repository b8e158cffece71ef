package kube

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testVA(rv string, finalizers []string, annotations map[string]string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{
		Name: "va-1", UID: "uid-1", ResourceVersion: rv, Finalizers: finalizers, Annotations: annotations,
	}}
}

// applyJSONPatch applies patch the way the API server does and returns the
// resulting object, so tests assert the effect, not only the bytes.
func applyJSONPatch(t *testing.T, obj any, patch []byte, into any) error {
	t.Helper()
	doc, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch %s does not decode: %v", patch, err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, into); err != nil {
		t.Fatal(err)
	}
	return nil
}

const fin = "external-attacher/csi-test"

// appliedPatch checks what a patch builder returned for va: no patch when
// wantNil (then ok is false), else the object the API server makes of va
// with the patch.
func appliedPatch(t *testing.T, va *storagev1.VolumeAttachment, patch []byte, err error, wantNil bool) (got storagev1.VolumeAttachment, ok bool) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if wantNil {
		if patch != nil {
			t.Fatalf("want no patch, got %s", patch)
		}
		return got, false
	}
	if err := applyJSONPatch(t, va, patch, &got); err != nil {
		t.Fatalf("apply %s: %v", patch, err)
	}
	return got, true
}

// finalizerCase is one row for a finalizer patch builder: the VA's
// finalizers, and the list after the patch (or no patch at all).
type finalizerCase struct {
	name       string
	finalizers []string
	wantNil    bool
	want       []string
}

func runFinalizerPatch(t *testing.T, rv string, build func(metav1.Object, string) ([]byte, error), tests []finalizerCase) {
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			va := testVA(rv, tt.finalizers, nil)
			patch, err := build(va, fin)
			got, ok := appliedPatch(t, va, patch, err, tt.wantNil)
			if ok && strings.Join(got.Finalizers, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("finalizers after patch = %v, want %v", got.Finalizers, tt.want)
			}
		})
	}
}

func TestAddFinalizerPatch(t *testing.T) {
	runFinalizerPatch(t, "7", AddFinalizerPatch, []finalizerCase{
		{name: "no finalizers field → list created", finalizers: nil, want: []string{fin}},
		{name: "other finalizers kept, ours appended", finalizers: []string{"other"}, want: []string{"other", fin}},
		{name: "already present → no patch", finalizers: []string{"other", fin}, wantNil: true},
	})
}

func TestRemoveFinalizerPatch_concurrentFinalizerChangeIsRejected(t *testing.T) {
	patch, err := RemoveFinalizerPatch(testVA("7", []string{"other", fin}, nil), fin)
	if err != nil {
		t.Fatal(err)
	}
	// Someone else added a finalizer since we read the object: the test op
	// must fail and nothing be applied, or "new" would be lost.
	server := testVA("8", []string{"other", fin, "new"}, nil)
	var got storagev1.VolumeAttachment
	if err := applyJSONPatch(t, server, patch, &got); err == nil {
		t.Fatalf("patch %s applied over a changed finalizer list; want the test to fail", patch)
	}
}

// A busy writer of labels, annotations or status must not starve the
// finalizer removal that ends a detach: only the finalizer list guards it.
func TestRemoveFinalizerPatch_otherChangesSinceTheReadDoNotBlockIt(t *testing.T) {
	patch, err := RemoveFinalizerPatch(testVA("7", []string{"other", fin}, nil), fin)
	if err != nil {
		t.Fatal(err)
	}
	server := testVA("42", []string{"other", fin}, map[string]string{"touched-by": "someone-else"})
	var got storagev1.VolumeAttachment
	if err := applyJSONPatch(t, server, patch, &got); err != nil {
		t.Fatalf("apply %s to a newer object with the same finalizers: %v", patch, err)
	}
	if strings.Join(got.Finalizers, ",") != "other" || got.Annotations["touched-by"] != "someone-else" {
		t.Fatalf("after patch: finalizers %v, annotations %v; want [other] and the other writer's annotation kept", got.Finalizers, got.Annotations)
	}
}

func TestRemoveFinalizerPatch(t *testing.T) {
	runFinalizerPatch(t, "3", RemoveFinalizerPatch, []finalizerCase{
		{name: "only ours → empty list", finalizers: []string{fin}, want: nil},
		{name: "others kept in order", finalizers: []string{"a", fin, "b"}, want: []string{"a", "b"}},
		{name: "duplicates all removed", finalizers: []string{fin, "a", fin}, want: []string{"a"}},
		{name: "absent → no patch", finalizers: []string{"a"}, wantNil: true},
		{name: "nil list → no patch", wantNil: true},
	})
}

func TestPatchWithoutResourceVersionIsRefused(t *testing.T) {
	if _, err := AddFinalizerPatch(testVA("", nil, nil), fin); err == nil {
		t.Fatal("AddFinalizerPatch on an object without resourceVersion: want error")
	}
	if _, err := SetAnnotationsPatch(testVA("", nil, nil), map[string]string{"a": "b"}); err == nil {
		t.Fatal("SetAnnotationsPatch on an object without resourceVersion: want error")
	}
}

func TestSetAnnotationsPatch(t *testing.T) {
	tests := []struct {
		name    string
		current map[string]string
		set     map[string]string
		wantNil bool
		want    map[string]string
	}{
		{name: "no annotations → map created", set: map[string]string{kubenames.VANodeIDAnnotation: "n1"}, want: map[string]string{kubenames.VANodeIDAnnotation: "n1"}},
		{name: "key with slash escaped, others kept", current: map[string]string{"x": "y"}, set: map[string]string{kubenames.VANodeIDAnnotation: "n1"}, want: map[string]string{"x": "y", kubenames.VANodeIDAnnotation: "n1"}},
		{name: "tilde escaped", current: map[string]string{}, set: map[string]string{"a~b/c": "v"}, want: map[string]string{"a~b/c": "v"}},
		{name: "value changed", current: map[string]string{"k": "old"}, set: map[string]string{"k": "new"}, want: map[string]string{"k": "new"}},
		{name: "empty value is a value", current: map[string]string{"x": "y"}, set: map[string]string{"k": ""}, want: map[string]string{"x": "y", "k": ""}},
		{name: "all equal → no patch", current: map[string]string{"k": "v", "x": "y"}, set: map[string]string{"k": "v"}, wantNil: true},
		{name: "nothing to set → no patch", current: map[string]string{"k": "v"}, set: nil, wantNil: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			va := testVA("5", nil, tt.current)
			patch, err := SetAnnotationsPatch(va, tt.set)
			got, ok := appliedPatch(t, va, patch, err, tt.wantNil)
			if !ok {
				return
			}
			if len(got.Annotations) != len(tt.want) {
				t.Fatalf("annotations after patch = %v, want %v", got.Annotations, tt.want)
			}
			for k, v := range tt.want {
				if gv, ok := got.Annotations[k]; !ok || gv != v {
					t.Fatalf("annotations after patch = %v, want %v", got.Annotations, tt.want)
				}
			}
		})
	}
}

func TestRemoveAnnotationsPatch(t *testing.T) {
	va := testVA("5", nil, map[string]string{kubenames.VANodeIDAnnotation: "n1", "keep": "me"})
	patch, err := RemoveAnnotationsPatch(va, kubenames.VANodeIDAnnotation, "absent", kubenames.VANodeIDAnnotation)
	got, _ := appliedPatch(t, va, patch, err, false)
	if len(got.Annotations) != 1 || got.Annotations["keep"] != "me" {
		t.Fatalf("annotations after patch = %v, want only keep=me", got.Annotations)
	}
	if patch, _ := RemoveAnnotationsPatch(va, "absent"); patch != nil {
		t.Fatalf("removing an absent key: want no patch, got %s", patch)
	}
}

func TestVolumeAttachmentStatusPatch(t *testing.T) {
	errTime := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	failed := storagev1.VolumeAttachmentStatus{
		AttachError: &storagev1.VolumeError{Time: errTime, Message: "rpc error: code = Internal"},
	}
	attached := storagev1.VolumeAttachmentStatus{
		Attached:           true,
		AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdb"},
	}
	tests := []struct {
		name      string
		current   storagev1.VolumeAttachmentStatus
		want      storagev1.VolumeAttachmentStatus
		wantPatch string // exact bytes; "" means no patch
	}{
		{
			name:      "attach succeeded after an error: error cleared with null",
			current:   failed,
			want:      attached,
			wantPatch: `{"metadata":{"uid":"uid-1"},"status":{"attachError":null,"attached":true,"attachmentMetadata":{"devicePath":"/dev/xvdb"}}}`,
		},
		{
			name:      "publish context key removed: null for that key only",
			current:   storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"a": "1", "b": "2"}},
			want:      storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"a": "1"}},
			wantPatch: `{"metadata":{"uid":"uid-1"},"status":{"attachmentMetadata":{"b":null}}}`,
		},
		{
			name:      "detached: attached false is sent explicitly",
			current:   attached,
			want:      storagev1.VolumeAttachmentStatus{},
			wantPatch: `{"metadata":{"uid":"uid-1"},"status":{"attached":false,"attachmentMetadata":null}}`,
		},
		{name: "equal → no patch", current: attached, want: *attached.DeepCopy()},
		{name: "nil and empty metadata are equal → no patch", current: storagev1.VolumeAttachmentStatus{AttachmentMetadata: map[string]string{}}, want: storagev1.VolumeAttachmentStatus{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			va := testVA("9", nil, nil)
			va.Status = tt.current
			patch, err := VolumeAttachmentStatusPatch(va, tt.want)
			if err != nil {
				t.Fatal(err)
			}
			if string(patch) != tt.wantPatch {
				t.Fatalf("patch = %s\nwant    %s", patch, tt.wantPatch)
			}
			if patch == nil {
				return
			}
			// Applying the merge patch must give exactly the wanted status.
			doc, _ := json.Marshal(va)
			out, err := jsonpatch.MergePatch(doc, patch)
			if err != nil {
				t.Fatal(err)
			}
			var got storagev1.VolumeAttachment
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			if again, _ := VolumeAttachmentStatusPatch(&got, tt.want); again != nil {
				t.Fatalf("after applying %s the status still differs: %s", patch, again)
			}
		})
	}
}

// Pods are not used by the builders' callers today, but the helpers take
// any metav1.Object; make sure a namespaced object works the same way.
func TestAddFinalizerPatch_namespacedObject(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", ResourceVersion: "1"}}
	patch, err := AddFinalizerPatch(pod, fin)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"op":"test","path":"/metadata/resourceVersion","value":"1"},{"op":"add","path":"/metadata/finalizers","value":["external-attacher/csi-test"]}]`
	if string(patch) != want {
		t.Fatalf("patch = %s\nwant    %s", patch, want)
	}
}
