package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/strvals"
)

// setValues parses `--set` arguments exactly as helm does.
func setValues(t *testing.T, sets ...string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	return vals
}

// A `--set` with a misspelled key, a value outside an enum, of the wrong
// type or below a minimum fails the install with the schema's message,
// naming the value; without values.schema.json Helm ignored the first
// and rendered the others into broken flags.
func TestHelmSchemaRejectsMistypedValues(t *testing.T) {
	for _, tc := range []struct {
		set  string
		says []string
	}{
		{"driver.replicass=3", []string{"replicass"}},
		{"imagePullSecret[0]=regcred", []string{"imagePullSecret"}},
		{"attachdetachController.podDisruptionBudget.minAvaliable=1", []string{"minAvaliable"}},
		{"metrics.podMonitor.enable=true", []string{"enable"}},
		{"csiAttacher.loggingFormat=yaml", []string{"loggingFormat"}},
		{"image.pullPolicy=Sometimes", []string{"pullPolicy"}},
		{"httpPort=0", []string{"httpPort"}},
		{"driver.replicas=-1", []string{"replicas"}},
		{"csiAttacher.workerThreads=0", []string{"workerThreads"}},
		{"attachdetachController.maxWaitForUnmount=6 minutes", []string{"maxWaitForUnmount"}},
		{"csiAttacher.leaderElection=yes", []string{"leaderElection"}},
		{"driver.socketDir=csi", []string{"socketDir"}},
		{"attachdetachController.resources.request.cpu=1", []string{"request"}},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := helmRender(t, "schema", setValues(t, tc.set))
			if err == nil {
				t.Fatalf("helm install --set %s rendered; want the schema to reject it", tc.set)
			}
			msg := err.Error()
			if !strings.Contains(msg, "values don't meet the specifications of the schema") {
				t.Errorf("error %q is not the schema's", msg)
			}
			for _, s := range tc.says {
				if !strings.Contains(msg, s) {
					t.Errorf("schema error does not name %q:\n%s", s, msg)
				}
			}
		})
	}
	// What the README shows, and values given the other ways --set can
	// spell them, pass.
	for _, sets := range [][]string{
		{"attachdetachController.nodeStatusWorkers=32", "csiAttacher.kubeAPIQPS=50", "csiAttacher.kubeAPIQPS=7.5"},
		{"driver.podDisruptionBudget.minAvailable=50%", "driver.enabled=true", "driver.replicas=3"},
		{"csiAttacher.reconcileSync=0", "csiAttacher.retryIntervalMax=1h30m", "csiAttacher.driverNames={ebs.csi.aws.com,efs.csi.aws.com}"},
		{"attachdetachController.nodeSelector.node-role\\.kubernetes\\.io/control-plane=", "attachdetachController.tolerations[0].operator=Exists"},
		{"global.imageRegistry=registry.example.com"},
	} {
		if _, err := helmRender(t, "schema", setValues(t, sets...)); err != nil {
			t.Errorf("--set %s: %v", strings.Join(sets, " --set "), err)
		}
	}
}

// schemaKeys lists the dotted paths of every property values.schema.json
// defines, following $ref, down to the free-form values (freeForm) whose
// keys are Kubernetes'.
func schemaKeys(t *testing.T, root map[string]any, prefix string, node map[string]any) []string {
	t.Helper()
	node = resolveRef(t, root, node)
	props, _ := node["properties"].(map[string]any)
	if props != nil && node["additionalProperties"] != false {
		t.Errorf("schema object %q has properties but allows others: a mistyped key under it would pass", prefix)
	}
	var out []string
	for k, v := range props {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		out = append(out, key)
		sub, _ := v.(map[string]any)
		sub = resolveRef(t, root, sub)
		if _, typed := sub["type"]; !typed && sub["anyOf"] == nil {
			t.Errorf("schema value %s has no type", key)
		}
		if !freeForm[k] {
			out = append(out, schemaKeys(t, root, key, sub)...)
		}
	}
	return out
}

func resolveRef(t *testing.T, root, node map[string]any) map[string]any {
	t.Helper()
	ref, ok := node["$ref"].(string)
	if !ok {
		return node
	}
	var cur any = root
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, _ := cur.(map[string]any)
		cur = m[part]
	}
	m, ok := cur.(map[string]any)
	if !ok {
		t.Fatalf("schema $ref %s resolves to nothing", ref)
	}
	return m
}

// values.schema.json and values.yaml name the same values: a value added
// to one only is caught here (Helm's own global excepted, for the chart as
// a subchart).
func TestHelmSchemaCoversEveryValue(t *testing.T) {
	vals := chartValues(t)
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	inValues := valueKeys("", vals)
	inSchema := schemaKeys(t, schema, "", schema)
	if len(inValues) < 20 || len(inSchema) < 20 {
		t.Fatalf("%d keys in values.yaml, %d in the schema: not parsed as expected", len(inValues), len(inSchema))
	}
	for _, k := range inValues {
		if !slices.Contains(inSchema, k) {
			t.Errorf("value %s of values.yaml is not in values.schema.json", k)
		}
	}
	for _, k := range inSchema {
		if !slices.Contains(inValues, k) && k != "global" {
			t.Errorf("value %s of values.schema.json is not in values.yaml", k)
		}
	}
}
