package volume

import (
	"slices"
	"strings"
	"testing"
)

func TestParseInTreePlugins(t *testing.T) {
	tests := []struct {
		name    string
		list    string
		want    []string
		wantErr string
	}{
		{name: "empty list → none", list: "", want: nil},
		{name: "one plugin", list: "kubernetes.io/gce-pd", want: []string{"kubernetes.io/gce-pd"}},
		{name: "several, blanks and empty items ignored, duplicates once", list: " kubernetes.io/gce-pd,,kubernetes.io/aws-ebs , kubernetes.io/gce-pd",
			want: []string{"kubernetes.io/gce-pd", "kubernetes.io/aws-ebs"}},
		{name: "every plugin csi-translation-lib knows", list: strings.Join(InTreePluginNames(), ","), want: InTreePluginNames()},
		{name: "CSI driver name instead of plugin name → error", list: "pd.csi.storage.gke.io", wantErr: `unknown in-tree volume plugin "pd.csi.storage.gke.io"`},
		{name: "typo → error listing the known names", list: "kubernetes.io/gce-pd,kubernetes.io/aws-eb", wantErr: `unknown in-tree volume plugin "kubernetes.io/aws-eb" (known: kubernetes.io/aws-ebs, `},
		{name: "plugin csi-translation-lib does not translate → error", list: "kubernetes.io/iscsi", wantErr: `unknown in-tree volume plugin "kubernetes.io/iscsi"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseInTreePlugins(tc.list)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseInTreePlugins(%q) = %v, %v; want an error containing %q", tc.list, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ParseInTreePlugins(%q) = %q, %v; want %q", tc.list, got, err, tc.want)
			}
		})
	}
}
