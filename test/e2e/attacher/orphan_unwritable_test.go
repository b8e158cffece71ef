package attacher_test

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher"
)

// The record's ConfigMap as the real API server refuses it: immutable, or
// holding the VolumeAttachment's name as a binaryData key. The orphan is
// tracked in memory, a new VolumeAttachment of its name (another node)
// says in its attachError why the orphan is not recorded and how to mend
// the ConfigMap, and is attached once the orphan's unpublish succeeds.
func TestOrphanRecordTheAPIServerRefusesHoldsNothingBack(t *testing.T) {
	for _, shape := range []struct {
		name string
		cm   func(key string) *v1.ConfigMap
	}{
		{"immutable", func(string) *v1.ConfigMap {
			immutable := true
			return &v1.ConfigMap{Immutable: &immutable, Data: map[string]string{}}
		}},
		{"binaryData key", func(key string) *v1.ConfigMap {
			return &v1.ConfigMap{BinaryData: map[string][]byte{key: []byte("x")}}
		}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			node2 := e.prefix + "-n2"
			e.createCSINode(node2, node2+"-id")
			pv, vaName := e.prefix+"-pv", e.prefix+"-va"
			cm := shape.cm(vaName)
			cm.Namespace, cm.Name = "default", attacher.OrphanRecordName(e.name)
			if _, err := e.client.CoreV1().ConfigMaps("default").Create(e.ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.createPV(pv)
			_, unpublishFault := e.orphanWithFailingUnpublish(pv, vaName)
			e.createVA(e.newVA(vaName, pv, node2))
			va := e.waitAttachError(vaName, "tracked in memory only")
			for _, want := range []string{"default/" + attacher.OrphanRecordName(e.name), "refuses the ConfigMap", "re-create it without immutable and binaryData"} {
				if !strings.Contains(va.Status.AttachError.Message, want) {
					t.Errorf("attachError %q does not say %q", va.Status.AttachError.Message, want)
				}
			}
			if msg := e.eventMessage(vaName, attacher.EventOrphanRecordFailed); !strings.Contains(msg, "re-create it") {
				t.Errorf("%s event %q does not say how to mend the ConfigMap", attacher.EventOrphanRecordFailed, msg)
			}
			e.driver.RemoveFault(unpublishFault)
			e.waitAttached(vaName, 30*time.Second)
			if got := e.driver.Published(pv); len(got) != 1 || got[0] != node2+"-id" {
				t.Errorf("%s published to %v, want only %s", pv, got, node2+"-id")
			}
		})
	}
}
