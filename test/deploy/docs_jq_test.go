package deploy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
)

// docs/migration.md's pre-flight queries ("In-tree iSCSI, FC and
// FlexVolume volumes are no longer attached"), run as written in bash with
// kubectl (k8s.io/kubectl's command, this test binary) and jq against an
// API server holding PersistentVolumes and Pods of each kind: the PV query
// lists exactly the iSCSI, FC and FlexVolume PVs, the Pod query exactly the
// Pods with such an inline volume; a CSI PV and a Pod with a CSI inline
// volume are in neither. jq is Debian's (or any) jq on PATH.
func TestMigrationPreflightQueriesListTheInTreeVolumes(t *testing.T) {
	jq, err := exec.LookPath("jq")
	if err != nil {
		t.Skip("jq is not installed (apt-get install jq): docs/migration.md's pre-flight queries need it")
	}
	t.Logf("jq: %s", jq)
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(string(doc)), " ")
	queries := regexp.MustCompile("`(kubectl get [^`]*\\| jq [^`]*)`").FindAllStringSubmatch(flat, -1)
	if len(queries) != 2 {
		t.Fatalf("docs/migration.md has %d kubectl … | jq queries, want the PV and the Pod query", len(queries))
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := cluster.Client()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	id := "preflight-" + hex.EncodeToString(suffix)
	if err := localcluster.CreateNamespace(ctx, client, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), id, metav1.DeleteOptions{})
		for _, k := range []string{"iscsi", "fc", "flex", "csi"} {
			_ = client.CoreV1().PersistentVolumes().Delete(context.Background(), id+"-"+k, metav1.DeleteOptions{})
		}
	})
	lun := int32(0)
	sources := map[string]v1.PersistentVolumeSource{
		"iscsi": {ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", Lun: 0}},
		"fc":    {FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0982991b8dc5"}, Lun: &lun}},
		"flex":  {FlexVolume: &v1.FlexPersistentVolumeSource{Driver: "example.com/flex"}},
		"csi":   {CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.latch.dev", VolumeHandle: id}},
	}
	for k, src := range sources {
		pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: id + "-" + k}, Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: src,
		}}
		if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	inline := map[string]v1.VolumeSource{
		"iscsi": {ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", Lun: 0}},
		"fc":    {FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0982991b8dc5"}, Lun: &lun}},
		"flex":  {FlexVolume: &v1.FlexVolumeSource{Driver: "example.com/flex"}},
		"csi":   {CSI: &v1.CSIVolumeSource{Driver: "mock.csi.latch.dev"}},
	}
	for k, src := range inline {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: id, Name: k}, Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: "app", Image: "registry.example/app:1", VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes:    []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, {Name: "data", VolumeSource: src}},
		}}
		if _, err := client.CoreV1().Pods(id).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(bin, "kubectl")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), runAsKubectl+"=1", "KUBECONFIG="+kubeconfig, "HOME="+t.TempDir(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	run := func(query string) []string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "bash", "-c", "set -eo pipefail\n"+query)
		cmd.Env = env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("`%s`: %v\n%s", query, err, stderr.String())
		}
		var ours []string
		for _, l := range strings.Fields(string(out)) {
			if strings.Contains(l, id) {
				ours = append(ours, l)
			}
		}
		slices.Sort(ours)
		return ours
	}
	if got, want := run(queries[0][1]), []string{id + "-fc", id + "-flex", id + "-iscsi"}; !slices.Equal(got, want) {
		t.Errorf("the PV query lists %q of this test's PVs, want %q:\n%s", got, want, queries[0][1])
	}
	if got, want := run(queries[1][1]), []string{id + "/fc", id + "/flex", id + "/iscsi"}; !slices.Equal(got, want) {
		t.Errorf("the Pod query lists %q of this test's Pods, want %q:\n%s", got, want, queries[1][1])
	}
}
