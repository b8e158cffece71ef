package decide

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// CSINodeFacts is what the decision needs to know about the CSINode of the
// key's node: whether the kubelet there has migrated an in-tree plugin to
// CSI. Only volumes whose plugin is in Config.MigrationByNode look at it.
type CSINodeFacts struct {
	// Exists is false when the node has no CSINode object.
	Exists bool
	// MigratedPlugins is the raw value of the CSINode annotation
	// storage.alpha.kubernetes.io/migrated-plugins (v1.MigratedPluginsAnnotationKey):
	// the in-tree plugin names the kubelet handles through CSI, separated
	// by commas.
	MigratedPlugins string
}

// CSINodeFactsOf extracts CSINodeFacts from a CSINode; nil means absent.
func CSINodeFactsOf(cn *storagev1.CSINode) CSINodeFacts {
	if cn == nil {
		return CSINodeFacts{}
	}
	return CSINodeFacts{Exists: true, MigratedPlugins: cn.Annotations[v1.MigratedPluginsAnnotationKey]}
}

// Migrated reports whether the CSINode lists plugin in its migrated-plugins
// annotation. Like kube-controller-manager, the value is split on commas
// and each item must equal the plugin name exactly (no trimming).
func (f CSINodeFacts) Migrated(plugin string) bool {
	if !f.Exists || plugin == "" {
		return false
	}
	for _, p := range strings.Split(f.MigratedPlugins, ",") {
		if p == plugin {
			return true
		}
	}
	return false
}

// needsNodeMigration returns the in-tree plugin of a wanted volume that may
// be attached through CSI only on nodes that have migrated it, and whether
// the key's node has not: the volume must then wait.
func needsNodeMigration(in Input) (plugin string, blocked bool) {
	plugin = in.Wanted.Volume.MigratedFrom
	if plugin == "" || !in.Config.MigrationByNode[plugin] {
		return "", false
	}
	return plugin, !in.CSINode.Migrated(plugin)
}

// NotMigratedMessage is the FailedAttachVolume text for a volume of the
// in-tree plugin whose node has not migrated it to CSI; csiNodeExists
// says which of the two conditions holds.
func NotMigratedMessage(specName, plugin, node string, csiNodeExists bool) string {
	var why string
	if csiNodeExists {
		why = fmt.Sprintf("CSINode %s does not list the plugin in its annotation %s", node, v1.MigratedPluginsAnnotationKey)
	} else {
		why = fmt.Sprintf("node %s has no CSINode, so nothing lists the plugin in the annotation %s", node, v1.MigratedPluginsAnnotationKey)
	}
	return volumeMsg("AttachVolume.Attach failed", specName,
		fmt.Sprintf(": in-tree plugin %s is not migrated to CSI on node %s: %s; waiting for the node to migrate it", plugin, node, why))
}

func notMigratedEvents(in Input, plugin string) []Event {
	cond := "no-csinode"
	if in.CSINode.Exists {
		cond = "not-listed"
	}
	key := "not-migrated/" + in.Key.String() + "/" + cond
	msg := NotMigratedMessage(in.Wanted.Volume.SpecName, plugin, in.Key.Node, in.CSINode.Exists)
	return podEvents(in, v1.EventTypeWarning, ReasonFailedAttachVolume, key, func(state.PodRef) string { return msg })
}
