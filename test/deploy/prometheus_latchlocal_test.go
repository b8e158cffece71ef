package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/latchlocal"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// Expectations for TestDashboardAndRulesOnLatchLocal. Every panel returns
// series, but those listed here; every rule evaluates without error, the
// alerts the scenario provokes return series, the ones it cannot provoke
// stay silent; the rest depend on what the test does not control.
var (
	panelsWithoutSeries = map[string]string{
		"Forced detaches (attachdetach-controller)": "no node goes down with a volume in use here (TestDashboardQueriesOnlyMetricsTheBinariesExport forces a detach)",
	}
	alertsThatFire = map[string]string{
		"LatchCompetingAttachDetachControllers": "a VolumeAttachment created by the field manager kube-controller-manager",
		"LatchVolumeAttachmentCreatesRefused":   "a ValidatingAdmissionPolicy refuses one volume's VolumeAttachment",
		"LatchOrphanRecordErrors":               "the orphan record holds an entry that is not a record (load error)",
		"LatchAttachErrors":                     "the mock driver fails the first two ControllerPublishVolume calls (--publish-failures)",
	}
	alertsThatStaySilent = map[string]string{
		"LatchAttachDetachControllerNoLeader": "latch-local's controller holds its Lease",
		"LatchOrphanedPublications":           "no VolumeAttachment is deleted while being published",
		"LatchOrphanRecordUnavailable":        "the record can be read and written",
		"LatchQueueBacklog":                   "a handful of volumes",
		"LatchDetachErrors":                   "every unpublish succeeds",
		"LatchAttachSlow":                     "attaches take seconds",
		"LatchDriverCallsWaiting":             "a handful of volumes: no driver call waits minutes for a slot",
		"LatchVolumeWaitingForMultiAttach":    "no Pod wants an exclusive volume attached to another node",
	}
	alertsNotJudged = map[string]string{
		"LatchForcedDetaches":     "no forced detach, so no series of its counter",
		"LatchAPIRequestsFailing": "the answers the API server gives the whole process (two API servers run in it) are not the test's to choose",
		"LatchAPIClientThrottled": "the client-side waits of the whole process are not the test's to choose",
		"LatchCompetingAttachers": "latch-local runs one csi-attacher",
		"LatchAttacherNoLeader":   "latch-local's csi-attacher runs without leader election: no leader_election_master_status of its Lease",
	}
	// metricsNotExported are metrics the rules select that latch-local
	// does not export in this run.
	metricsNotExported = map[string]string{
		"attach_detach_controller_attachdetach_controller_forced_detaches": "no forced detach",
		"latch_attacher_competing_instances":                               "exported by csi-attacher only while it runs without leader election and watches its Lease",
		"latch_attachdetach_volumes_waiting_for_multi_attach":              "a driver's series appears once one of its volumes waits for Multi-Attach; none does here",
	}
)

// A real Prometheus (Debian's package; loopback; scrape and rule
// evaluation every second) scrapes latch-local's two metrics endpoints while
// volumes attach, fail to attach, are refused and detach, with the rule
// files loaded. Then every dashboard panel's queries and every rule's
// expression evaluate without error through Prometheus' HTTP API, every
// panel returns series (but panelsWithoutSeries), Prometheus' rule manager
// reports every rule healthy, and the alerts behave as the scenario says.
func TestDashboardAndRulesOnLatchLocal(t *testing.T) {
	promBin := debianPrometheusTool(t, "prometheus")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	started := time.Now()
	attacherAddr, controllerAddr := testsupport.FreeAddr(t), testsupport.FreeAddr(t)
	env, err := latchlocal.Start(ctx, latchlocal.Options{Nodes: 1, PublishFailures: 2,
		AttacherMetricsAddress: attacherAddr, ControllerMetricsAddress: controllerAddr})
	if err != nil {
		t.Fatalf("latch-local: %v", err)
	}
	t.Cleanup(env.Stop)
	prom := startPrometheus(ctx, t, promBin, map[string]string{"csi-attacher": attacherAddr, "attachdetach-controller": controllerAddr})
	t.Logf("latch-local and Prometheus up after %s", time.Since(started).Round(time.Millisecond))

	runMonitoringScenario(ctx, t, env.Client, env.Opts.Driver)
	t.Logf("scenario done after %s", time.Since(started).Round(time.Millisecond))

	// The dashboard's job variable lists both jobs.
	waitFor(ctx, t, "both jobs in the dashboard's job variable", func() (bool, error) {
		jobs, err := prom.labelValues(ctx, "job", "workqueue_depth")
		return err == nil && slices.Contains(jobs, "csi-attacher") && slices.Contains(jobs, "attachdetach-controller"), nil
	})

	// Every panel returns series once the scenario's samples are scraped
	// (histogram rates need two samples in their window).
	panels := dashboardPanels(t)
	var missing []string
	deadline := time.Now().Add(time.Minute)
	for {
		missing = missing[:0]
		for _, p := range panels {
			n := 0
			for _, expr := range p.exprs {
				got, err := prom.query(ctx, grafanaVars.Replace(expr))
				if err != nil {
					t.Fatalf("panel %q: %s: %v", p.title, expr, err)
				}
				n += got
			}
			if _, exempt := panelsWithoutSeries[p.title]; n == 0 && !exempt {
				missing = append(missing, p.title)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for _, m := range missing {
		t.Errorf("dashboard panel %q returns no series", m)
	}

	// Every rule is loaded and evaluated without error by Prometheus.
	groups := allRuleGroups(t)
	waitFor(ctx, t, "every rule evaluated", func() (bool, error) {
		rules, err := prom.rules(ctx)
		if err != nil {
			return false, nil
		}
		n := 0
		for _, g := range groups {
			n += len(g.Rules)
		}
		evaluated := 0
		for _, r := range rules {
			if r.LastEvaluation.After(started) {
				evaluated++
			}
		}
		return len(rules) == n && evaluated == n, nil
	})
	rules, err := prom.rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if r.Health != "ok" || r.LastError != "" {
			t.Errorf("Prometheus evaluates rule %s with health %q, error %q", r.Name, r.Health, r.LastError)
		}
	}

	// Each alert's expression, queried: those the scenario provokes return
	// series, those it cannot provoke none; the metrics they select exist.
	for _, g := range groups {
		for _, r := range g.Rules {
			_, fires := alertsThatFire[r.Alert]
			_, silent := alertsThatStaySilent[r.Alert]
			_, notJudged := alertsNotJudged[r.Alert]
			if !fires && !silent && !notJudged {
				t.Errorf("alert %s: say in prometheus_latchlocal_test.go whether latch-local makes it fire", r.Alert)
				continue
			}
			var n int
			if fires {
				waitFor(ctx, t, r.Alert+"'s expression returning series ("+alertsThatFire[r.Alert]+")", func() (bool, error) {
					n, err = prom.query(ctx, r.Expr)
					return err == nil && n > 0, err
				})
			} else if n, err = prom.query(ctx, r.Expr); err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			} else if silent && n > 0 {
				t.Errorf("alert %s's expression returns %d series, want none (%s)", r.Alert, n, alertsThatStaySilent[r.Alert])
			}
			for _, m := range promqlMetricNames(r.Expr) {
				if _, ok := metricsNotExported[m]; ok {
					continue
				}
				if got, err := prom.query(ctx, m); err != nil || got == 0 {
					t.Errorf("alert %s selects %s, which latch-local does not export (%d series, %v)", r.Alert, m, got, err)
				}
			}
		}
	}
	t.Logf("checked %d panels and %d rule groups after %s", len(panels), len(groups), time.Since(started).Round(time.Millisecond))
}

// runMonitoringScenario does on latch-local what the dashboard and the
// alerts show: attaches (the first two publishes fail), a detach, a
// refused VolumeAttachment create, an invalid orphan record entry and a
// VolumeAttachment created by another controller's field manager.
func runMonitoringScenario(ctx context.Context, t *testing.T, client kubernetes.Interface, driver string) {
	t.Helper()
	const ns = "default"
	node := latchlocal.NodeName(1)
	remove, err := testsupport.DenyVolumeAttachmentsOf(ctx, client, "refused", "latch-monitoring-freeze", "latch-monitoring-freeze")
	t.Cleanup(func() { remove(context.WithoutCancel(ctx)) })
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kept", "detached", "refused", "foreign"} {
		if _, _, err := localcluster.CreateBoundVolume(ctx, client, localcluster.VolumeSpec{Namespace: ns, Name: name, Driver: driver}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"kept", "detached"} {
		if _, err := client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, name, node, name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"kept", "detached"} {
		va := kubenames.VolumeAttachmentName(name, driver, node)
		waitFor(ctx, t, "VolumeAttachment "+va+" attached", func() (bool, error) {
			got, err := client.StorageV1().VolumeAttachments().Get(ctx, va, metav1.GetOptions{})
			return err == nil && got.Status.Attached, nil
		})
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "detached", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The policy is in force within a second or so: the Pod comes after.
	time.Sleep(2 * time.Second)
	if _, err := client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, "refused", node, "refused"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	record := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: kube.OrphanRecordName(driver)}, Data: map[string]string{"junk": "not a record"}}
	if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, record, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := "foreign"
	foreign := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "foreign-controller-va"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}}}
	if _, err := client.StorageV1().VolumeAttachments().Create(ctx, foreign, metav1.CreateOptions{FieldManager: "kube-controller-manager"}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "VolumeAttachment of the deleted Pod's volume gone", func() (bool, error) {
		_, err := client.StorageV1().VolumeAttachments().Get(ctx, kubenames.VolumeAttachmentName("detached", driver, node), metav1.GetOptions{})
		return err != nil, nil
	})
}

// grafanaVars stands in for the dashboard's variables: every job, and
// windows that hold several of the test's one-second scrapes.
var grafanaVars = strings.NewReplacer(`$job`, `.*`, `$__rate_interval`, `1m`, `$__range`, `1h`)

type dashboardPanel struct {
	title string
	exprs []string
}

// dashboardPanels are the dashboard's panels with queries.
func dashboardPanels(t *testing.T) []dashboardPanel {
	t.Helper()
	var out []dashboardPanel
	for _, p := range readDashboard(t).Panels {
		dp := dashboardPanel{title: p.Title}
		for _, target := range p.Targets {
			dp.exprs = append(dp.exprs, target.Expr)
		}
		if len(dp.exprs) > 0 {
			out = append(out, dp)
		}
	}
	if len(out) < 15 {
		t.Fatalf("%s: %d panels with queries, want the dashboard's", dashboardPath, len(out))
	}
	return out
}

// promServer is a running Prometheus' HTTP API.
type promServer struct{ base string }

// startPrometheus runs prometheus on loopback with its storage in a
// temporary directory, scraping each job's target every second and
// evaluating the rule files every second; it is stopped at cleanup.
func startPrometheus(ctx context.Context, t *testing.T, bin string, targets map[string]string) *promServer {
	t.Helper()
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n",
		filepath.Join(repoRoot(t), rulesDir, "*.rules.yaml"))
	for _, job := range slices.Sorted(maps.Keys(targets)) {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets: [%q]\n", job, targets[job])
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testsupport.FreeAddr(t)
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			raw, _ := os.ReadFile(logPath)
			t.Logf("prometheus log (last lines):\n%s\nconfiguration:\n%s", lastLines(string(raw), 20), cfg.String())
		}
	})
	p := &promServer{base: "http://" + addr}
	waitFor(ctx, t, "Prometheus ready", func() (bool, error) {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return p
}

// get calls the HTTP API and decodes its data.
func (p *promServer) get(ctx context.Context, path string, params url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, params, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

// query evaluates an instant query and returns how many series it returns.
func (p *promServer) query(ctx context.Context, expr string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data)
	return len(data.Result), err
}

func (p *promServer) labelValues(ctx context.Context, label, match string) ([]string, error) {
	var values []string
	err := p.get(ctx, "/api/v1/label/"+label+"/values", url.Values{"match[]": {match}}, &values)
	return values, err
}

type promRule struct {
	Name           string    `json:"name"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

// rules are the rules Prometheus' rule manager runs, with their health.
func (p *promServer) rules(ctx context.Context) ([]promRule, error) {
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", nil, &data); err != nil {
		return nil, err
	}
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}
