package attacher

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	csitrans "k8s.io/csi-translation-lib"

	"github.com/latchcsi/latch/internal/kube"
)

// Transform is the informer transform the attacher wants, for a shared
// informer factory: managed fields dropped everywhere, PVs of other drivers
// trimmed to what the PV finalizer logic needs. In-tree PVs of a plugin
// migrated to driver count as ours and keep their in-tree source, which the
// attacher translates.
func Transform(driver string) cache.TransformFunc {
	trimPV := kube.TrimForeignPVs(DriverOfPV(csitrans.New()), func(d string) bool { return d == driver })
	return func(obj any) (any, error) {
		obj, err := kube.StripManagedFields(obj)
		if err != nil {
			return obj, err
		}
		if _, ok := obj.(*v1.PersistentVolume); ok {
			return trimPV(obj)
		}
		return obj, nil
	}
}

// DriverOfPV returns the CSI driver that handles a PV: spec.csi.driver, or
// for an in-tree PV the CSI driver its plugin migrates to ("" when none).
func DriverOfPV(tr InTreeNames) kube.PVDriverFunc {
	return func(pv *v1.PersistentVolume) string {
		if d := kube.CSIDriverOfPV(pv); d != "" {
			return d
		}
		plugin, err := tr.GetInTreePluginNameFromSpec(pv, nil)
		if err != nil || plugin == "" {
			return ""
		}
		d, err := tr.GetCSINameFromInTreeName(plugin)
		if err != nil {
			return ""
		}
		return d
	}
}

// InTreeNames maps in-tree volume sources to CSI driver names;
// csi-translation-lib's CSITranslator satisfies it.
type InTreeNames interface {
	GetInTreePluginNameFromSpec(pv *v1.PersistentVolume, vol *v1.Volume) (string, error)
	GetCSINameFromInTreeName(pluginName string) (string, error)
}
