package state_test

import (
	"testing"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

func TestNames_forgetIfOnlyDropsAnUnusedNameOfThatKey(t *testing.T) {
	n := state.NewNames()
	k := key("h1", "node-a")
	n.Set("va-1", k)
	if n.ForgetIf("va-1", key("h2", "node-a"), true) {
		t.Fatal("dropped a name that maps to another key")
	}
	if n.ForgetIf("va-1", k, false) {
		t.Fatal("dropped a name whose key is still in use")
	}
	if got, ok := n.Get("va-1"); !ok || got != k || n.Len() != 1 {
		t.Fatalf("Get = %v, %v; Len = %d", got, ok, n.Len())
	}
	if !n.ForgetIf("va-1", k, true) || n.Len() != 0 {
		t.Fatalf("unused name not dropped; Len = %d", n.Len())
	}
}

func TestPods_recordsArePerNamespaceAndNameAndCopied(t *testing.T) {
	p := state.NewPods()
	k := state.PodKey("ns", "web-0")
	if k != "ns/web-0" {
		t.Fatalf("PodKey = %q", k)
	}
	p.Set(k, state.PodRecord{UID: "u1", Node: "node-a"})
	got, ok := p.Get(k)
	if !ok || got.UID != "u1" || got.Node != "node-a" {
		t.Fatalf("Get = %+v, %v", got, ok)
	}
	got.Node = "changed"
	if again, _ := p.Get(k); again.Node != "node-a" {
		t.Fatal("Get handed out the stored record")
	}
	p.Forget(k)
	if _, ok := p.Get(k); ok {
		t.Fatal("record kept after Forget")
	}
}
