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
