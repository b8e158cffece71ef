package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/diagnose"
)

// `status --fail-pending-older=5m` exits 3 and lists every attach or
// detach pending for longer, ten minutes after the VolumeAttachments were
// made; an attached one is not listed, and with a longer threshold the
// same cluster exits 0.
func TestStatusFailPendingOlderExitsThreeAndListsThem(t *testing.T) {
	f := newFixture(t, "pending")
	nodeA, nodeB := f.node("a", true), f.node("b", true)
	done, stuck := f.volume("done"), f.volume("stuck")
	f.va(done, nodeA, storagev1.VolumeAttachmentStatus{Attached: true})
	pending := f.va(stuck, nodeB, storagev1.VolumeAttachmentStatus{})
	later := func() time.Time { return time.Now().Add(10 * time.Minute) }
	status := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := run(f.ctx, "latchctl", append([]string{"--kubeconfig", f.kubeconfig, "status", "--driver", f.driver}, args...), &out, &errOut, later)
		t.Logf("latchctl status %s → exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		return out.String(), code
	}

	out, code := status("--fail-pending-older=5m")
	if code != exitPendingTooLong {
		t.Errorf("exit %d, want %d with an attach pending for 10m", code, exitPendingTooLong)
	}
	mustLine(t, out, "PROBLEM", "VolumeAttachment "+pending.Name, "attach to node "+nodeB, "pending for 10m", "longer than 5m")
	mustSay(t, out, "next: latchctl explain va "+pending.Name)
	if strings.Contains(out, "attach to node "+nodeA) {
		t.Errorf("the attached VolumeAttachment on %s is listed as pending", nodeA)
	}

	out, code = status("--fail-pending-older=5m", "-o", "json")
	var doc struct{ Findings []diagnose.Finding }
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("-o json: %v", err)
	}
	if code != exitPendingTooLong || len(doc.Findings) != 1 || doc.Findings[0].Check != diagnose.CheckPendingTooLong || doc.Findings[0].Object != "VolumeAttachment "+pending.Name {
		t.Errorf("-o json: exit %d, findings %+v; want %d and the one pending VolumeAttachment", code, doc.Findings, exitPendingTooLong)
	}

	if _, code := status("--fail-pending-older=1h"); code != exitHealthy {
		t.Errorf("--fail-pending-older=1h: exit %d, want %d (nothing pending that long, nothing failing)", code, exitHealthy)
	}
	for _, bad := range [][]string{{"status", "--fail-pending-older=0"}, {"status", "--fail-pending-older=-1m"}, {"status", "--fail-pending-older=soon"},
		{"explain", "pod", "x", "--fail-pending-older=5m"}} {
		if _, code := f.latchctl(bad...); code != exitError {
			t.Errorf("latchctl %q: exit %d, want %d", bad, code, exitError)
		}
	}
}
