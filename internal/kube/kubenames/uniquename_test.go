package kubenames

import (
	"errors"
	"strings"
	"testing"
)

func TestUniqueVolumeName(t *testing.T) {
	got := UniqueVolumeName("csi.example.com", "vol^1")
	if want := "kubernetes.io/csi/csi.example.com^vol^1"; string(got) != want {
		t.Fatalf("UniqueVolumeName = %q, want %q", got, want)
	}
}

func TestParseUniqueVolumeName(t *testing.T) {
	tests := []struct {
		name          string
		in            string
		driver        string
		handle        string
		wantErrSubstr string
	}{
		{name: "plain", in: "kubernetes.io/csi/csi.example.com^vol-1", driver: "csi.example.com", handle: "vol-1"},
		{name: "handle with separator keeps it", in: "kubernetes.io/csi/d^a^b", driver: "d", handle: "a^b"},
		{name: "handle with slashes", in: "kubernetes.io/csi/pd.csi.storage.gke.io^projects/p/zones/z/disks/d", driver: "pd.csi.storage.gke.io", handle: "projects/p/zones/z/disks/d"},
		{name: "in-tree plugin rejected", in: "kubernetes.io/aws-ebs/vol-1", wantErrSubstr: "missing prefix"},
		{name: "no separator", in: "kubernetes.io/csi/driver-only", wantErrSubstr: "missing separator"},
		{name: "empty driver", in: "kubernetes.io/csi/^vol", wantErrSubstr: "empty driver"},
		{name: "empty handle", in: "kubernetes.io/csi/d^", wantErrSubstr: "empty volume handle"},
		{name: "empty string", in: "", wantErrSubstr: "missing prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			driver, handle, err := ParseUniqueVolumeName(tt.in)
			if tt.wantErrSubstr != "" {
				if err == nil {
					t.Fatalf("ParseUniqueVolumeName(%q) = %q, %q, want error containing %q", tt.in, driver, handle, tt.wantErrSubstr)
				}
				if !errors.Is(err, ErrInvalidUniqueVolumeName) || !strings.Contains(err.Error(), tt.wantErrSubstr) {
					t.Fatalf("ParseUniqueVolumeName(%q) error = %v, want ErrInvalidUniqueVolumeName containing %q", tt.in, err, tt.wantErrSubstr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseUniqueVolumeName(%q) unexpected error: %v", tt.in, err)
			}
			if driver != tt.driver || handle != tt.handle {
				t.Fatalf("ParseUniqueVolumeName(%q) = %q, %q, want %q, %q", tt.in, driver, handle, tt.driver, tt.handle)
			}
		})
	}
}

func FuzzUniqueVolumeNameRoundTrip(f *testing.F) {
	f.Add("csi.example.com", "vol-1")
	f.Add("d", "a^b")
	f.Add("", "x")
	f.Add("d^", "x")
	f.Fuzz(func(t *testing.T, driver, handle string) {
		name := UniqueVolumeName(driver, handle)
		gotDriver, gotHandle, err := ParseUniqueVolumeName(string(name))
		valid := driver != "" && handle != "" && !strings.Contains(driver, UniqueVolumeNameSeparator)
		if !valid {
			// Driver names never contain '^'; such inputs may parse to a
			// different split, but must never panic and an error must wrap
			// the sentinel.
			if err != nil && !errors.Is(err, ErrInvalidUniqueVolumeName) {
				t.Fatalf("error %v does not wrap ErrInvalidUniqueVolumeName", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("round trip of %q, %q failed: %v", driver, handle, err)
		}
		if gotDriver != driver || gotHandle != handle {
			t.Fatalf("round trip of %q, %q gave %q, %q", driver, handle, gotDriver, gotHandle)
		}
	})
}

func FuzzParseUniqueVolumeName(f *testing.F) {
	for _, s := range []string{"kubernetes.io/csi/d^h", "kubernetes.io/csi/", "kubernetes.io/csi/^", "kubernetes.io/aws-ebs/x", "", "kubernetes.io/csi/d^h^i"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		driver, handle, err := ParseUniqueVolumeName(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidUniqueVolumeName) {
				t.Fatalf("error %v does not wrap ErrInvalidUniqueVolumeName", err)
			}
			return
		}
		if string(UniqueVolumeName(driver, handle)) != s {
			t.Fatalf("ParseUniqueVolumeName(%q) = %q, %q which does not rebuild the input", s, driver, handle)
		}
	})
}

// The digest the verify pass compares is the one the name spells, also
// when the scratch buffer is reused for a shorter volume after a longer
// one; any name not of the controller's form spells none.
func TestVolumeAttachmentDigest_isWhatTheNameSpells(t *testing.T) {
	var buf []byte
	for _, v := range [][3]string{
		{"vol-with-a-rather-long-handle-0123456789", "csi.example.com", "node-a"},
		{"v", "d", "n"},
		{"", "", ""},
		{"pd-1", "pd.csi.storage.gke.io", "gke-node-7"},
	} {
		var sum [32]byte
		sum, buf = VolumeAttachmentDigest(buf, v[0], v[1], v[2])
		got, ok := VolumeAttachmentNameDigest(VolumeAttachmentName(v[0], v[1], v[2]))
		if !ok || got != sum {
			t.Errorf("%q: the name spells %x (ok %v), the digest is %x", v, got, ok, sum)
		}
	}
	name := VolumeAttachmentName("vol-1", "csi.example.com", "node-1")
	for _, other := range []string{
		strings.ToUpper(name[:4]) + name[4:], // prefix in capitals
		name[:4] + strings.ToUpper(name[4:]), // digits in capitals
		name[:len(name)-1],                   // 63 digits
		name + "0",                           // 65 digits
		"pv-" + name[4:],                     // another prefix
		name[:len(name)-1] + "g",             // not hex
		"my-volume-attachment",
	} {
		if _, ok := VolumeAttachmentNameDigest(other); ok {
			t.Errorf("VolumeAttachmentNameDigest(%q) = ok, want a name of another form", other)
		}
	}
}

func FuzzVolumeAttachmentNameDigest(f *testing.F) {
	f.Add("vol-1", "csi.example.com", "node-1")
	f.Add("", "", "")
	f.Fuzz(func(t *testing.T, handle, driver, node string) {
		sum, _ := VolumeAttachmentDigest(nil, handle, driver, node)
		got, ok := VolumeAttachmentNameDigest(VolumeAttachmentName(handle, driver, node))
		if !ok || got != sum {
			t.Fatalf("the name of %q %q %q spells %x (ok %v), its digest is %x", handle, driver, node, got, ok, sum)
		}
	})
}
