package volume

import (
	"fmt"
	"slices"
	"strings"

	csitrans "k8s.io/csi-translation-lib"
)

// InTreePluginNames returns the in-tree plugin names csi-translation-lib
// can translate to CSI, sorted.
func InTreePluginNames() []string {
	names := make([]string, 0, len(DefaultMigratedPlugins()))
	for name := range DefaultMigratedPlugins() {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// ParseInTreePlugins parses a comma-separated list of in-tree plugin
// names (as in --csi-migration-by-node). Blanks around names and empty
// items are ignored; duplicates are kept once. Every name must be one
// csi-translation-lib translates, else the error lists the known ones.
func ParseInTreePlugins(list string) ([]string, error) {
	var out []string
	for item := range strings.SplitSeq(list, ",") {
		name := strings.TrimSpace(item)
		if name == "" || slices.Contains(out, name) {
			continue
		}
		out = append(out, name)
	}
	if err := CheckInTreePlugins(out); err != nil {
		return nil, err
	}
	return out, nil
}

// CheckInTreePlugins returns an error naming the first of names that is
// not an in-tree plugin csi-translation-lib translates.
func CheckInTreePlugins(names []string) error {
	tr := csitrans.New()
	for _, name := range names {
		if !tr.IsMigratableIntreePluginByName(name) {
			return fmt.Errorf("unknown in-tree volume plugin %q (known: %s)", name, strings.Join(InTreePluginNames(), ", "))
		}
	}
	return nil
}
