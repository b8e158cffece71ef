package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseOptions_defaultsDifferFromUpstreamOnlyWhereDocumented(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	// docs/csi-attacher.md lists these three as latch's defaults.
	if o.workerThreads != 100 || o.driverConcurrency != "adaptive" || o.Client.QPS != 5000 || o.Client.Burst != 10000 {
		t.Errorf("worker-threads, driver-concurrency, kube-api-qps, kube-api-burst = %d, %q, %v, %d; want 100, adaptive, 5000, 10000", o.workerThreads, o.driverConcurrency, o.Client.QPS, o.Client.Burst)
	}
	// Upstream's.
	if o.timeout != 15*time.Second || o.resync != 10*time.Minute || o.retryIntervalStart != time.Second || o.retryIntervalMax != 5*time.Minute {
		t.Errorf("timeout, resync, retry intervals = %s, %s, %s, %s; want upstream's 15s, 10m, 1s, 5m", o.timeout, o.resync, o.retryIntervalStart, o.retryIntervalMax)
	}
	if o.apiWorkers != 0 {
		t.Errorf("api-worker-threads = %d, want 0 (derived from --worker-threads)", o.apiWorkers)
	}
}

func TestParseOptions_upstreamWorkerThreadsIsAccepted(t *testing.T) {
	o, err := parseOptions([]string{"--worker-threads=10"})
	if err != nil {
		t.Fatal(err)
	}
	if o.workerThreads != 10 {
		t.Errorf("worker-threads = %d, want 10", o.workerThreads)
	}
}

func TestParseOptions_rejectsNonPositiveWorkerThreads(t *testing.T) {
	for _, arg := range []string{"--worker-threads=0", "--worker-threads=-3"} {
		_, err := parseOptions([]string{arg})
		if err == nil || !strings.Contains(err.Error(), "--worker-threads must be positive") {
			t.Errorf("%s: error %v, want one naming --worker-threads", arg, err)
		}
	}
	if _, err := parseOptions([]string{"--api-worker-threads=-1"}); err == nil || !strings.Contains(err.Error(), "--api-worker-threads") {
		t.Errorf("--api-worker-threads=-1: error %v, want one naming the flag", err)
	}
}

func TestParseOptions_kubeAPIContentTypeDefaultsToProtobuf(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Client.ContentType != "application/vnd.kubernetes.protobuf" {
		t.Errorf("kube-api-content-type = %q, want protobuf", o.Client.ContentType)
	}
	o, err = parseOptions([]string{"--kube-api-content-type=application/json"})
	if err != nil || o.Client.ContentType != "application/json" {
		t.Fatalf("--kube-api-content-type=application/json: options %+v, error %v", o, err)
	}
	_, err = parseOptions([]string{"--kube-api-content-type=text/plain"})
	if err == nil || !strings.Contains(err.Error(), "--kube-api-content-type") || !strings.Contains(err.Error(), "text/plain") {
		t.Errorf("--kube-api-content-type=text/plain: error %v, want one naming the flag and the value", err)
	}
}

func TestParseOptions_driverConcurrency(t *testing.T) {
	o, err := parseOptions([]string{"--driver-concurrency=fixed", "--worker-threads=10"})
	if err != nil {
		t.Fatal(err)
	}
	if o.driverConcurrency != "fixed" || o.workerThreads != 10 {
		t.Errorf("driver-concurrency, worker-threads = %q, %d; want fixed, 10", o.driverConcurrency, o.workerThreads)
	}
	if _, err := parseOptions([]string{"--driver-concurrency=aimd"}); err == nil || !strings.Contains(err.Error(), `--driver-concurrency must be adaptive or fixed, got "aimd"`) {
		t.Errorf("--driver-concurrency=aimd: error %v, want one naming the flag and its values", err)
	}
}
