package controller

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// A delete the informer learned of only through a relist arrives as a
// tombstone; it must reach the handler like a plain delete. Anything else
// is not the handler's kind and is dropped.
func TestOnDelete_unwrapsTombstones_ignoresOtherTypes(t *testing.T) {
	var got []string
	h := onDelete(func(n *v1.Node) { got = append(got, n.Name) })
	h(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain"}})
	h(cache.DeletedFinalStateUnknown{Key: "tomb", Obj: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "tomb"}}})
	h(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a-pod"}})
	h(cache.DeletedFinalStateUnknown{Key: "x", Obj: &v1.Pod{}})
	if want := []string{"plain", "tomb"}; !slices.Equal(got, want) {
		t.Fatalf("handled %q, want %q", got, want)
	}
}
