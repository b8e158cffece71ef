package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseOptions_defaultsMatchKubeControllerManager(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"kube-api-qps", o.Client.QPS, 500.0},
		{"kube-api-burst", o.Client.Burst, 1000},
		{"kube-api-content-type", o.Client.ContentType, "application/vnd.kubernetes.protobuf"},
		{"leader-elect", o.Leader.Enabled, true},
		{"leader-elect-lease-duration", o.Leader.LeaseDuration, 15 * time.Second},
		{"leader-elect-renew-deadline", o.Leader.RenewDeadline, 10 * time.Second},
		{"leader-elect-retry-period", o.Leader.RetryPeriod, 2 * time.Second},
		{"leader-elect-resource-namespace", o.Leader.Namespace, "kube-system"},
		{"leader-elect-resource-name", o.Leader.LeaseName, "latch-attachdetach-controller"},
		{"concurrent-attach-detach-syncs", o.workers, 150},
		{"node-status-workers", o.nodeStatusWorkers, 48},
		{"max-wait-for-unmount", o.maxWaitForUnmount, 6 * time.Minute},
		{"disable-force-detach-on-timeout", o.disableForceDetachOnTimeout, false},
		{"reconcile-sync", o.reconcileSync, time.Minute},
		{"coexistence-report-period", o.coexistencePeriod, 5 * time.Minute},
		{"http-endpoint", o.httpEndpoint, "127.0.0.1:8080"},
		{"health-endpoint", o.healthEndpoint, ""},
		{"metrics-path", o.MetricsPath, "/metrics"},
		{"csi-migration-by-node", len(o.csiMigrationByNode), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("--%s default = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestParseOptions_rejectsInvalidValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrent-attach-detach-syncs=0"}, "--concurrent-attach-detach-syncs"},
		{[]string{"--node-status-workers=0"}, "--node-status-workers must be positive, got 0"},
		{[]string{"--max-wait-for-unmount=0s"}, "--max-wait-for-unmount"},
		{[]string{"--reconcile-sync=-1s"}, "--reconcile-sync"},
		{[]string{"--coexistence-report-period=-1s"}, "--coexistence-report-period"},
		{[]string{"--leader-elect-renew-deadline=20s"}, "--leader-elect-renew-deadline"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--csi-migration-by-node=pd.csi.storage.gke.io"}, `--csi-migration-by-node: unknown in-tree volume plugin "pd.csi.storage.gke.io"`},
	} {
		_, err := parseOptions(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseOptions(%v) = %v, want an error about %s", tc.args, err, tc.want)
		}
	}
}

func TestParseOptions_loggingFlags(t *testing.T) {
	o, err := parseOptions([]string{"-v=4", "--logging-format=json", "--leader-elect=false"})
	if err != nil {
		t.Fatal(err)
	}
	if o.logging.Format != "json" || o.logging.Verbosity != 4 || o.Leader.Enabled {
		t.Errorf("options = format %q, v %d, leaderElect %v", o.logging.Format, o.logging.Verbosity, o.Leader.Enabled)
	}
}

func TestParseOptions_csiMigrationByNode(t *testing.T) {
	o, err := parseOptions([]string{"--csi-migration-by-node=kubernetes.io/gce-pd, kubernetes.io/aws-ebs"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"kubernetes.io/gce-pd", "kubernetes.io/aws-ebs"}; !slices.Equal(o.csiMigrationByNode, want) {
		t.Errorf("--csi-migration-by-node = %q, want %q", o.csiMigrationByNode, want)
	}
}

func TestParseOptions_kubeAPIContentTypeAcceptsJSONAndRejectsOthers(t *testing.T) {
	o, err := parseOptions([]string{"--kube-api-content-type=application/json"})
	if err != nil || o.Client.ContentType != "application/json" {
		t.Fatalf("--kube-api-content-type=application/json: options %+v, error %v", o, err)
	}
	_, err = parseOptions([]string{"--kube-api-content-type=application/yaml"})
	if err == nil || !strings.Contains(err.Error(), "--kube-api-content-type") || !strings.Contains(err.Error(), "application/yaml") {
		t.Errorf("--kube-api-content-type=application/yaml: error %v, want one naming the flag and the value", err)
	}
}
