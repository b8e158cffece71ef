package kubenames

import (
	"crypto/sha256"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// naiveSanitize is a deliberately naive reference: the regular expression
// upstream external-attacher uses, plus latch's rule for the empty string
// (upstream panics there).
func naiveSanitize(driver string) string {
	name := regexp.MustCompile("[^a-zA-Z0-9-]").ReplaceAllString(driver, "-")
	if name == "" || name[len(name)-1] == '-' {
		name += "X"
	}
	return name
}

func TestSanitizeDriverName(t *testing.T) {
	tests := []struct {
		driver, want string
	}{
		{"csi/test", "csi-test"},
		{"foo.", "foo-X"},
		{"hostpath.csi.k8s.io", "hostpath-csi-k8s-io"},
		{"ebs.csi.aws.com", "ebs-csi-aws-com"},
		{"already-ok", "already-ok"},
		{"trailing-", "trailing-X"},
		{"UPPER_lower_09", "UPPER-lower-09"},
		{"é", "-X"},       // one multi-byte rune becomes one '-'
		{"a\xffb", "a-b"}, // an invalid byte counts as one character
		{"", "X"},
	}
	for _, tt := range tests {
		t.Run(tt.driver, func(t *testing.T) {
			if got := SanitizeDriverName(tt.driver); got != tt.want {
				t.Errorf("SanitizeDriverName(%q) = %q, want %q", tt.driver, got, tt.want)
			}
		})
	}
}

func FuzzSanitizeDriverName(f *testing.F) {
	for _, s := range []string{"csi/test", "foo.", "", "-", "a-", "é", "a\xffb", "hostpath.csi.k8s.io", "___"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, driver string) {
		got := SanitizeDriverName(driver)
		if want := naiveSanitize(driver); got != want {
			t.Fatalf("SanitizeDriverName(%q) = %q, reference gives %q", driver, got, want)
		}
		if strings.HasSuffix(got, "-") || got == "" {
			t.Fatalf("SanitizeDriverName(%q) = %q: must not be empty or end with '-'", driver, got)
		}
		if strings.TrimLeft(got, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
			t.Fatalf("SanitizeDriverName(%q) = %q: contains characters outside [a-zA-Z0-9-]", driver, got)
		}
	})
}

func TestVolumeAttachmentName(t *testing.T) {
	// Pinned golden value (printf 'vol-1csi.example.comnode-1' | sha256sum):
	// an accidental change of the naming scheme would orphan every existing
	// VolumeAttachment, so it must fail loudly.
	const want = "csi-b74c7fc125891ffa0d0f2e0d645733e3fae7fba3066e76500a771ea08be9da28"
	if got := VolumeAttachmentName("vol-1", "csi.example.com", "node-1"); got != want {
		t.Fatalf("VolumeAttachmentName = %q, want %q", got, want)
	}
}

func FuzzVolumeAttachmentName(f *testing.F) {
	f.Add("vol-1", "csi.example.com", "node-1")
	f.Add("", "", "")
	f.Add("projects/p/zones/z/disks/d", "pd.csi.storage.gke.io", "gke-node-abc")
	f.Fuzz(func(t *testing.T, handle, driver, node string) {
		got := VolumeAttachmentName(handle, driver, node)
		want := fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
		if got != want {
			t.Fatalf("VolumeAttachmentName(%q, %q, %q) = %q, want %q", handle, driver, node, got, want)
		}
		if len(got) > 253 {
			t.Fatalf("VolumeAttachmentName is %d characters, longer than an object name may be", len(got))
		}
	})
}
