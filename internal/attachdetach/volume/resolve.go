package volume

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/csi-translation-lib/plugins"
	"k8s.io/klog/v2"
)

// Objects looks up the API objects a pod volume refers to. Implementations
// return (nil, false) when the object does not exist (a lister's NotFound);
// returned objects are shared with the cache and never modified here.
type Objects interface {
	PersistentVolumeClaim(namespace, name string) (*v1.PersistentVolumeClaim, bool)
	PersistentVolume(name string) (*v1.PersistentVolume, bool)
	CSIDriver(name string) (*storagev1.CSIDriver, bool)
}

// Status says what the controller should do with one pod volume.
type Status int

const (
	// StatusAttach: the volume is an attachable CSI volume (Result.Volume).
	StatusAttach Status = iota
	// StatusNoAttach: nothing for the controller to do, ever, for this
	// spec (emptyDir, configMap, CSI ephemeral, attachRequired=false...).
	StatusNoAttach
	// StatusPending: not attachable yet; the object named in the message
	// is missing or not bound. Re-resolve when that object changes.
	StatusPending
	// StatusInvalid: the spec cannot be attached as it is (translation
	// failed, empty driver or handle, ephemeral PVC of another pod).
	StatusInvalid
	// StatusUnsupported: an in-tree attachable plugin (iSCSI, FC,
	// FlexVolume) that kube-controller-manager would attach but latch does
	// not; pods using it on managed nodes wait for volumesAttached forever,
	// so the caller should warn about it.
	StatusUnsupported
)

var statusNames = [...]string{"Attach", "NoAttach", "Pending", "Invalid", "Unsupported"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Result is the resolution of one pod volume.
type Result struct {
	// PodVolume is the name of the volume in the pod spec.
	PodVolume string
	Status    Status
	// Volume is valid when Status is StatusAttach.
	Volume Attachable
	// Message says why the volume is not attachable, naming the object
	// involved; empty for StatusAttach.
	Message string
}

// DefaultMigratedPlugins is the set of in-tree plugins whose volumes are
// handled by their CSI driver. Every plugin csi-translation-lib can
// translate has GA'd (or, for Portworx, default-on) migration in
// Kubernetes 1.36, so all are on.
func DefaultMigratedPlugins() map[string]bool {
	return map[string]bool{
		plugins.AWSEBSInTreePluginName:    true,
		plugins.GCEPDInTreePluginName:     true,
		plugins.CinderInTreePluginName:    true,
		plugins.AzureDiskInTreePluginName: true,
		plugins.AzureFileInTreePluginName: true,
		plugins.VSphereInTreePluginName:   true,
		plugins.PortworxVolumePluginName:  true,
	}
}

// Resolver resolves pod volumes. It holds configuration only; the zero
// value has no plugin migrated, use NewResolver.
type Resolver struct {
	// migrated is the set of in-tree plugin names with migration on.
	migrated   map[string]bool
	translator csitrans.CSITranslator
}

// NewResolver returns a Resolver that translates the in-tree plugins in
// migrated (see DefaultMigratedPlugins); nil means the default set.
func NewResolver(migrated map[string]bool) *Resolver {
	if migrated == nil {
		migrated = DefaultMigratedPlugins()
	}
	m := make(map[string]bool, len(migrated))
	for k, on := range migrated {
		if on {
			m[k] = true
		}
	}
	return &Resolver{migrated: m, translator: csitrans.New()}
}

// Resolve resolves one volume of pod. ctx only carries the logger that
// csi-translation-lib wants.
func (r *Resolver) Resolve(ctx context.Context, pod *v1.Pod, vol *v1.Volume, objs Objects) Result {
	res := r.resolve(ctx, pod, vol, objs)
	res.PodVolume = vol.Name
	return res
}

func (r *Resolver) resolve(ctx context.Context, pod *v1.Pod, vol *v1.Volume, objs Objects) Result {
	claim, readOnly, ephemeral := claimOf(pod, vol)
	if claim == "" {
		return r.resolveInline(ctx, pod.Namespace, vol, objs)
	}
	pvc, ok := objs.PersistentVolumeClaim(pod.Namespace, claim)
	if !ok {
		return pending("PVC %s/%s not found", pod.Namespace, claim)
	}
	if ephemeral && !metav1.IsControlledBy(pvc, pod) {
		// Same rule as k8s.io/component-helpers/storage/ephemeral: a PVC
		// with the generated name but another owner must not be used.
		return invalid("PVC %s/%s was not created for pod %s/%s (pod is not owner)", pvc.Namespace, pvc.Name, pod.Namespace, pod.Name)
	}
	if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" {
		return pending("PVC %s/%s is not bound (phase %q, volumeName %q)", pod.Namespace, claim, pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	pv, ok := objs.PersistentVolume(pvc.Spec.VolumeName)
	if !ok {
		return pending("PV %s bound to PVC %s/%s not found", pvc.Spec.VolumeName, pod.Namespace, claim)
	}
	// The PVC says it is bound but the PV may not agree yet (binding
	// writes the PV first, but caches can be observed in any order) or may
	// belong to a re-created PVC with the same name: only a matching UID
	// proves this PV is the claim's.
	if pv.Spec.ClaimRef == nil {
		return pending("PV %s is not yet bound to PVC %s/%s (spec.claimRef is nil)", pv.Name, pod.Namespace, claim)
	}
	if pv.Spec.ClaimRef.UID != pvc.UID {
		return pending("PV %s is bound to another claim: spec.claimRef.uid %q, PVC %s/%s has uid %q", pv.Name, pv.Spec.ClaimRef.UID, pod.Namespace, claim, pvc.UID)
	}
	return r.resolvePV(ctx, pv, readOnly, objs)
}

// claimOf returns the PVC a pod volume uses, if any.
func claimOf(pod *v1.Pod, vol *v1.Volume) (claim string, readOnly, ephemeral bool) {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName, vol.PersistentVolumeClaim.ReadOnly, false
	case vol.Ephemeral != nil:
		// Generic ephemeral volume: the PVC is named <pod>-<volume>.
		return pod.Name + "-" + vol.Name, false, true
	}
	return "", false, false
}

func (r *Resolver) resolvePV(ctx context.Context, pv *v1.PersistentVolume, readOnly bool, objs Objects) Result {
	a, res := r.pvAttachable(ctx, pv, readOnly)
	if res.Status != StatusAttach {
		return res
	}
	return requireAttach(a, objs)
}

// pvAttachable translates pv if needed and builds its Attachable; a
// non-Attach result says why there is none.
func (r *Resolver) pvAttachable(ctx context.Context, pv *v1.PersistentVolume, readOnly bool) (Attachable, Result) {
	migratedFrom := ""
	if pv.Spec.CSI == nil {
		plugin, migratable := r.migratablePV(pv)
		if !migratable {
			return Attachable{}, notCSI(pv.Spec.ISCSI != nil || pv.Spec.FC != nil || pv.Spec.FlexVolume != nil, "PV %s", pv.Name)
		}
		translated, err := r.translator.TranslateInTreePVToCSI(klog.FromContext(ctx), pv)
		if err != nil {
			return Attachable{}, invalid("translate in-tree PV %s (%s) to CSI: %v", pv.Name, plugin, err)
		}
		pv, migratedFrom = translated, plugin
	}
	if res, ok := checkCSI(pv.Spec.CSI, "PV "+pv.Name); !ok {
		return Attachable{}, res
	}
	a := NewAttachable(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
	a.PVName = pv.Name
	a.SpecName = pv.Name
	a.AccessModes = pv.Spec.AccessModes
	a.ReadOnly = readOnly
	a.MigratedFrom = migratedFrom
	return a, Result{Status: StatusAttach}
}

func (r *Resolver) resolveInline(ctx context.Context, namespace string, vol *v1.Volume, objs Objects) Result {
	if vol.CSI != nil {
		// Inline CSI volumes are always ephemeral (lifecycle mode
		// Ephemeral): the kubelet's CSI plugin never attaches them.
		return noAttach("volume %s is a CSI ephemeral inline volume", vol.Name)
	}
	plugin, migratable := r.migratableInline(vol)
	if !migratable {
		return notCSI(vol.ISCSI != nil || vol.FC != nil || vol.FlexVolume != nil, "volume %s", vol.Name)
	}
	// The namespace becomes the secret namespace of plugins that use
	// secrets (Azure File); the VolumeAttachment carries it.
	pv, err := r.translator.TranslateInTreeInlineVolumeToCSI(klog.FromContext(ctx), vol, namespace)
	if err != nil {
		return invalid("translate in-tree inline volume %s (%s) to CSI: %v", vol.Name, plugin, err)
	}
	if res, ok := checkCSI(pv.Spec.CSI, "inline volume "+vol.Name); !ok {
		return res
	}
	a := NewAttachable(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
	a.InlineSpec = &pv.Spec
	a.SpecName = pv.Name
	a.AccessModes = pv.Spec.AccessModes
	a.ReadOnly = pv.Spec.CSI.ReadOnly
	a.MigratedFrom = plugin
	return requireAttach(a, objs)
}

func (r *Resolver) migratablePV(pv *v1.PersistentVolume) (string, bool) {
	if !r.translator.IsPVMigratable(pv) {
		return "", false
	}
	plugin, err := r.translator.GetInTreePluginNameFromSpec(pv, nil)
	return plugin, err == nil && r.migrated[plugin]
}

func (r *Resolver) migratableInline(vol *v1.Volume) (string, bool) {
	if !r.translator.IsInlineMigratable(vol) {
		return "", false
	}
	plugin, err := r.translator.GetInTreePluginNameFromSpec(nil, vol)
	return plugin, err == nil && r.migrated[plugin]
}

func checkCSI(src *v1.CSIPersistentVolumeSource, what string) (Result, bool) {
	switch {
	case src == nil:
		return invalid("%s has no CSI source after translation", what), false
	case src.Driver == "":
		return invalid("%s has an empty CSI driver name", what), false
	case src.VolumeHandle == "":
		return invalid("%s has an empty CSI volume handle", what), false
	}
	return Result{}, true
}

// requireAttach applies CSIDriver.spec.attachRequired: no CSIDriver object
// means attach is required, as in the kubelet's and KCM's CSI plugin.
func requireAttach(a Attachable, objs Objects) Result {
	if d, ok := objs.CSIDriver(a.Driver); ok && d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired {
		return noAttach("CSIDriver %s has attachRequired=false", a.Driver)
	}
	return Result{Status: StatusAttach, Volume: a}
}

func notCSI(inTreeAttachable bool, format string, args ...any) Result {
	what := fmt.Sprintf(format, args...)
	if inTreeAttachable {
		return Result{Status: StatusUnsupported, Message: what + " uses an in-tree attachable plugin (iSCSI, FC or FlexVolume) that latch does not attach"}
	}
	return Result{Status: StatusNoAttach, Message: what + " is neither a CSI volume nor migrated to CSI"}
}

func pending(format string, args ...any) Result {
	return Result{Status: StatusPending, Message: fmt.Sprintf(format, args...)}
}

func invalid(format string, args ...any) Result {
	return Result{Status: StatusInvalid, Message: fmt.Sprintf(format, args...)}
}

func noAttach(format string, args ...any) Result {
	return Result{Status: StatusNoAttach, Message: fmt.Sprintf(format, args...)}
}
