package attacher_test

import (
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/kube/kubetest"
)

// TestAttacherSpeaksProtobufToTheAPIServer checks on the real API server
// that the csi-attacher's lists, watches and writes are answered in
// protobuf, as kube-controller-manager's are, unless it is told to speak
// JSON (--kube-api-content-type=application/json).
func TestAttacherSpeaksProtobufToTheAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, want string
	}{
		{"default", "", "application/vnd.kubernetes.protobuf"},
		{"json", "application/json", "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{noAttacher: true})
			wire := kubetest.NewWireFormats()
			cfg := cluster.RESTConfig()
			cfg.ContentType = tc.contentType
			cfg.WrapTransport = wire.Wrap
			stop := e.startAttacherAs(cfg, envOptions{}, "", "default")
			defer stop()

			_, va, _ := e.attachOne(30 * time.Second)
			e.deleteVA(va)
			e.waitGone(va)
			stop()

			for _, res := range []string{"volumeattachments", "persistentvolumes", "csinodes"} {
				got := wire.Of(res)
				if len(got) != 1 || got[tc.want] == 0 {
					t.Errorf("%s answered as %v, want only %s", res, got, tc.want)
				}
			}
			// Lists, the watch, the finalizer patches and the status patch
			// all went through: at least 3 answers about VolumeAttachments.
			if n := wire.Of("volumeattachments")[tc.want]; n < 3 {
				t.Errorf("%d VolumeAttachment answers recorded (%v), want the list, the watch and the writes", n, wire.Of("volumeattachments"))
			}
		})
	}
}
