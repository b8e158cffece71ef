package attacher

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher/decide"
)

// The decisions live in package decide (pure: no clients, no gRPC, no
// clock, no logger); these names stay here for the packages that use them.
const (
	// AnnVolumeHandle is the CSI volume handle the volume was published with.
	AnnVolumeHandle = decide.AnnVolumeHandle
	// AnnSecretRef is "namespace/name" of the controller-publish secret, if any.
	AnnSecretRef = decide.AnnSecretRef
)

// DriverInfo is what the decisions need to know about the driver.
type DriverInfo = decide.DriverInfo

// Reason classifies why an attach or detach cannot go on.
type Reason = decide.Reason

// Blocked says why nothing can be done yet.
type Blocked = decide.Blocked

// Translator turns in-tree volume specs into CSI ones (CSI migration);
// csi-translation-lib's CSITranslator is one.
type Translator interface {
	// IsPVMigratable reports whether pv is an in-tree PV with a CSI driver
	// to migrate to.
	IsPVMigratable(pv *v1.PersistentVolume) bool
	// TranslateInTreePVToCSI returns a copy of pv with spec.csi set.
	TranslateInTreePVToCSI(logger klog.Logger, pv *v1.PersistentVolume) (*v1.PersistentVolume, error)
}

// boundTranslator is a Translator with the pass's logger bound, the
// logger-free form package decide takes.
type boundTranslator struct {
	tr     Translator
	logger klog.Logger
}

func (b boundTranslator) IsPVMigratable(pv *v1.PersistentVolume) bool { return b.tr.IsPVMigratable(pv) }

func (b boundTranslator) TranslateInTreePVToCSI(pv *v1.PersistentVolume) (*v1.PersistentVolume, error) {
	return b.tr.TranslateInTreePVToCSI(b.logger, pv)
}

// bindTranslator returns tr with logger bound, or nil without a translator.
func bindTranslator(tr Translator, logger klog.Logger) decide.Translator {
	if tr == nil {
		return nil
	}
	return boundTranslator{tr: tr, logger: logger}
}
