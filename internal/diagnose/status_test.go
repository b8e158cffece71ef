package diagnose

import (
	"slices"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func statusVA(name, driver, node string, created time.Duration, mutate func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	pv := "pv-" + name
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: ago(created)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	if mutate != nil {
		mutate(va)
	}
	return va
}

func TestAttachmentsStates(t *testing.T) {
	vas := []*storagev1.VolumeAttachment{
		statusVA("attached", "a.csi", "n1", time.Hour, func(va *storagev1.VolumeAttachment) {
			va.Status.Attached = true
			// A stale attachError next to attached=true is not a failure.
			va.Status.AttachError = &storagev1.VolumeError{Message: "old", Time: ago(time.Hour)}
		}),
		statusVA("pending", "a.csi", "n1", 2*time.Minute, nil),
		statusVA("failing", "a.csi", "n2", 5*time.Minute, func(va *storagev1.VolumeAttachment) {
			va.Status.AttachError = &storagev1.VolumeError{Message: "rpc error: boom", Time: ago(30 * time.Second)}
		}),
		statusVA("detaching", "b.csi", "n1", time.Hour, func(va *storagev1.VolumeAttachment) {
			va.Status.Attached = true
			va.DeletionTimestamp = agoPtr(7 * time.Minute)
			va.Status.DetachError = &storagev1.VolumeError{Message: "unpublish failed", Time: ago(time.Minute)}
		}),
	}
	rows, err := Attachments(now, vas, StatusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Row{
		"attached":  {State: StateAttached, AgeSeconds: 3600},
		"pending":   {State: StatePending, AgeSeconds: 120},
		"failing":   {State: StateFailing, AgeSeconds: 300, Error: "rpc error: boom", ErrorAgeSeconds: 30},
		"detaching": {State: StateDetaching, AgeSeconds: 420, Error: "unpublish failed", ErrorAgeSeconds: 60},
	}
	for _, r := range rows {
		w := want[r.Name]
		if r.State != w.State || r.AgeSeconds != w.AgeSeconds || r.Error != w.Error || r.ErrorAgeSeconds != w.ErrorAgeSeconds {
			t.Errorf("row %s = %+v, want state %s age %d error %q (%ds)", r.Name, r, w.State, w.AgeSeconds, w.Error, w.ErrorAgeSeconds)
		}
		if r.PersistentVolume != "pv-"+r.Name {
			t.Errorf("row %s PV = %q", r.Name, r.PersistentVolume)
		}
	}
	if !Failing(rows) {
		t.Error("Failing() = false with a failing row")
	}
	if Failing(rows[:0]) {
		t.Error("Failing() = true without rows")
	}
}

func TestAttachmentsSortAndFilter(t *testing.T) {
	vas := []*storagev1.VolumeAttachment{
		statusVA("v1", "b.csi", "n1", time.Minute, nil),
		statusVA("v2", "a.csi", "n2", time.Hour, nil),
		statusVA("v3", "a.csi", "n1", 10*time.Minute, nil),
		statusVA("v4", "b.csi", "n0", 2*time.Hour, nil),
	}
	for _, tc := range []struct {
		name string
		opts StatusOptions
		want []string
	}{
		{"default groups by driver then node", StatusOptions{}, []string{"v3", "v2", "v4", "v1"}},
		{"--sort-by=node groups by node then driver", StatusOptions{SortBy: SortNode}, []string{"v4", "v3", "v1", "v2"}},
		{"--sort-by=age puts the oldest first", StatusOptions{SortBy: SortAge}, []string{"v4", "v2", "v3", "v1"}},
		{"--sort-by=name", StatusOptions{SortBy: SortName}, []string{"v1", "v2", "v3", "v4"}},
		{"--driver keeps one driver", StatusOptions{Driver: "b.csi"}, []string{"v4", "v1"}},
		{"--driver of no VA gives an empty, non-nil list", StatusOptions{Driver: "none"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := Attachments(now, vas, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, r := range rows {
				got = append(got, r.Name)
			}
			if !slices.Equal(got, tc.want) || rows == nil {
				t.Errorf("order = %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := Attachments(now, vas, StatusOptions{SortBy: "size"}); err == nil {
		t.Error("unknown sort key accepted")
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 90 * time.Second: "90s", 150 * time.Second: "2m30s", 5 * time.Minute: "5m",
		45 * time.Minute: "45m", 5 * time.Hour: "5h", 72 * time.Hour: "3d",
	} {
		if got := HumanDuration(d); got != want {
			t.Errorf("HumanDuration(%s) = %s, want %s", d, got, want)
		}
	}
}
