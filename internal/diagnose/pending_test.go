package diagnose

import (
	"slices"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
)

// `status --fail-pending-older=5m`: attaches that have not completed
// (pending, failing) for more than 5 minutes since creation and detaches
// not completed 5 minutes after deletion was requested are listed, in row
// order; attached ones, young ones and a detach whose VolumeAttachment is
// old but whose deletion is recent are not.
func TestPendingFindings(t *testing.T) {
	vas := []*storagev1.VolumeAttachment{
		statusVA("attached-old", "a.csi", "n1", time.Hour, func(va *storagev1.VolumeAttachment) { va.Status.Attached = true }),
		statusVA("pending-young", "a.csi", "n1", 4*time.Minute, nil),
		statusVA("pending-old", "a.csi", "n2", 6*time.Minute, nil),
		statusVA("failing-old", "a.csi", "n3", 10*time.Minute, func(va *storagev1.VolumeAttachment) {
			va.Status.AttachError = &storagev1.VolumeError{Message: "quota exceeded", Time: ago(time.Minute)}
		}),
		statusVA("detach-recent", "b.csi", "n1", time.Hour, func(va *storagev1.VolumeAttachment) {
			va.Status.Attached = true
			va.DeletionTimestamp = agoPtr(time.Minute)
		}),
		statusVA("detach-old", "b.csi", "n1", 2*time.Minute, func(va *storagev1.VolumeAttachment) {
			va.Status.Attached = true
			va.DeletionTimestamp = agoPtr(30 * time.Minute)
		}),
	}
	rows, err := Attachments(now, vas, StatusOptions{SortBy: SortName})
	if err != nil {
		t.Fatal(err)
	}
	got := PendingFindings(rows, 5*time.Minute)
	var objects []string
	for _, f := range got {
		objects = append(objects, f.Object)
		if f.Check != CheckPendingTooLong || f.Status != StatusProblem || !strings.HasPrefix(f.Hint, "latchctl explain va ") {
			t.Errorf("finding %+v: want a %s problem with the explain command", f, CheckPendingTooLong)
		}
	}
	want := []string{"VolumeAttachment detach-old", "VolumeAttachment failing-old", "VolumeAttachment pending-old"}
	if !slices.Equal(objects, want) {
		t.Fatalf("pending too long: %v, want %v", objects, want)
	}
	for i, says := range [][]string{
		{"detach from node n1", "driver b.csi", "pending for 30m", "longer than 5m"},
		{"attach to node n3", "pending for 10m", "quota exceeded"},
		{"attach to node n2", "pending for 6m"},
	} {
		for _, s := range says {
			if !strings.Contains(got[i].Message, s) {
				t.Errorf("%s: message %q lacks %q", got[i].Object, got[i].Message, s)
			}
		}
	}
	if got := PendingFindings(rows, time.Hour); len(got) != 0 {
		t.Errorf("with an hour: %v, want none", got)
	}
}
