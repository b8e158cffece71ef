package kube

import (
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzFinalizerAndLeaseNamesAreValidObjectNames checks that every driver
// name Kubernetes accepts gives a finalizer the API server accepts and a
// Lease name that is a valid object name, so a driver can never be stuck on
// an invalid write. Kubernetes validates the driver names in PV
// spec.csi.driver, VolumeAttachment spec.attacher and CSINode entries as a
// DNS subdomain of at most 63 characters *ignoring case*
// (ValidateCSIDriverName lower-cases before checking), and the CSI spec
// allows [a-zA-Z0-9] too: "Example.CSI.Driver" is a valid driver name.
func FuzzFinalizerAndLeaseNamesAreValidObjectNames(f *testing.F) {
	for _, s := range []string{"csi.example.com", "a", "a.b-c", "x--y..z", strings.Repeat("a", 63), "0.0", "hostpath.csi.k8s.io", "Example.CSI.Driver", "A", strings.Repeat("Z", 63)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, driver string) {
		if len(driver) > 63 || len(validation.IsDNS1123Subdomain(strings.ToLower(driver))) != 0 {
			return // not a driver name Kubernetes would store
		}
		fin := kubenames.AttacherFinalizer(driver)
		if errs := validation.IsQualifiedName(fin); len(errs) != 0 {
			t.Fatalf("finalizer %q of driver %q is not a qualified name: %v", fin, driver, errs)
		}
		if kubenames.PVFinalizer(driver) != fin {
			t.Fatalf("PV and VA finalizers differ for %q", driver)
		}
		lease := LeaseName(driver)
		if errs := validation.IsDNS1123Subdomain(lease); len(errs) != 0 {
			t.Fatalf("Lease name %q of driver %q is not a valid object name: %v", lease, driver, errs)
		}
		// Dots are legal in a qualified name's prefix but not wanted in the
		// suffix: upstream replaces them, and so must we, to match.
		if strings.ContainsAny(fin[len("external-attacher/"):], "._") {
			t.Fatalf("finalizer %q kept a character sanitizing must replace", fin)
		}
	})
}
