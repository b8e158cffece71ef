package controller

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	csitrans "k8s.io/csi-translation-lib"
)

// Informer indexes, so that a change to one object re-evaluates only the
// Pods it concerns instead of every Pod.
const (
	// podByClaimIndex: "<namespace>/<claim>" of every PVC a Pod uses,
	// generic ephemeral volumes included.
	podByClaimIndex = "latch-pod-by-claim"
	// podByNodeIndex: spec.nodeName.
	podByNodeIndex = "latch-pod-by-node"
	// podByInlineDriverIndex: the CSI driver of inline in-tree volumes
	// that CSI migration translates (their CSIDriver decides
	// attachRequired).
	podByInlineDriverIndex = "latch-pod-by-inline-driver"
	// pvByDriverIndex: the CSI driver of a PV, translated for in-tree PVs.
	pvByDriverIndex = "latch-pv-by-driver"
)

func (c *Controller) addIndexers() error {
	tr := csitrans.New()
	if err := c.pods.AddIndexers(cache.Indexers{
		podByClaimIndex:        podClaims,
		podByNodeIndex:         podNode,
		podByInlineDriverIndex: func(obj any) ([]string, error) { return podInlineDrivers(tr, obj) },
	}); err != nil {
		return fmt.Errorf("add Pod indexers: %w", err)
	}
	if err := c.pvs.AddIndexers(cache.Indexers{
		pvByDriverIndex: func(obj any) ([]string, error) { return pvDriver(tr, obj) },
	}); err != nil {
		return fmt.Errorf("add PersistentVolume indexers: %w", err)
	}
	return nil
}

func claimKey(namespace, name string) string { return namespace + "/" + name }

func podClaims(obj any) ([]string, error) {
	pod, ok := obj.(*cachedPod)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, vol := range pod.volumes {
		switch {
		case vol.PersistentVolumeClaim != nil:
			out = append(out, claimKey(pod.namespace, vol.PersistentVolumeClaim.ClaimName))
		case vol.Ephemeral != nil:
			out = append(out, claimKey(pod.namespace, pod.name+"-"+vol.Name))
		}
	}
	return out, nil
}

func podNode(obj any) ([]string, error) {
	pod, ok := obj.(*cachedPod)
	if !ok || pod.nodeName == "" {
		return nil, nil
	}
	return []string{pod.nodeName}, nil
}

func podInlineDrivers(tr csitrans.CSITranslator, obj any) ([]string, error) {
	pod, ok := obj.(*cachedPod)
	if !ok {
		return nil, nil
	}
	var out []string
	for i := range pod.volumes {
		vol := &pod.volumes[i]
		if vol.PersistentVolumeClaim != nil || vol.Ephemeral != nil || vol.CSI != nil || !tr.IsInlineMigratable(vol) {
			continue
		}
		if d := inTreeDriver(tr, nil, vol); d != "" {
			out = append(out, d)
		}
	}
	return out, nil
}

func pvDriver(tr csitrans.CSITranslator, obj any) ([]string, error) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return nil, nil
	}
	if pv.Spec.CSI != nil {
		return []string{pv.Spec.CSI.Driver}, nil
	}
	if !tr.IsPVMigratable(pv) {
		return nil, nil
	}
	if d := inTreeDriver(tr, pv, nil); d != "" {
		return []string{d}, nil
	}
	return nil, nil
}

// inTreeDriver returns the CSI driver an in-tree spec migrates to, "" when
// none.
func inTreeDriver(tr csitrans.CSITranslator, pv *v1.PersistentVolume, vol *v1.Volume) string {
	plugin, err := tr.GetInTreePluginNameFromSpec(pv, vol)
	if err != nil {
		return ""
	}
	driver, err := tr.GetCSINameFromInTreeName(plugin)
	if err != nil {
		return ""
	}
	return driver
}
