package csi

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// linesWith counts the lines of logs that contain every one of parts.
func linesWith(logs string, parts ...string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// At -v=5, where csi-lib-utils' connection package logs every call too
// when its Connect is used, each CSI call shows its request once and its
// answer once, secrets stripped.
func TestLogging_eachCallLoggedOnceAtVerbosity5(t *testing.T) {
	const secret = "s3cr3t-Passw0rd-5"
	logs := publishUnpublishLogged(t, 5, secret, [3]string{"vol-1", "vol-2", "vol-3"})
	for _, want := range []struct {
		what  string
		parts []string
	}{
		{"request of the failed publish", []string{"ControllerPublishVolume", "vol-1", "request="}},
		{"request of the publish", []string{"ControllerPublishVolume", "vol-2", "request="}},
		{"request of the unpublish", []string{"ControllerUnpublishVolume", "vol-3", "request="}},
		{"answers", []string{"response="}},
		{"failures", []string{"backend down"}},
	} {
		n := linesWith(logs, want.parts...)
		wantN := 1
		if want.what == "answers" {
			wantN = 2 // the publish and the unpublish that succeeded
		}
		if n != wantN {
			t.Errorf("%s: %d log lines with %q, want %d:\n%s", want.what, n, want.parts, wantN, logs)
		}
	}
	if strings.Contains(logs, secret) {
		t.Fatalf("secret value found in the log:\n%s", logs)
	}
}

// MaxLogLength (csi-attacher's --max-grpc-log-length) caps the logged
// request and answer, and never lets a secret through.
func TestLogging_maxLogLengthCapsRequestAndResponse(t *testing.T) {
	const secret = "s3cr3t-Passw0rd-cap"
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5), ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	d := &fakeDriver{publishContext: map[string]string{"devicePath": strings.Repeat("d", 200)}}
	c := connectFake(t, ctx, d, Options{MaxLogLength: 30})
	_, err := c.ControllerPublish(ctx, PublishRequest{VolumeID: "vol-" + strings.Repeat("v", 100), NodeID: "node-1",
		Secrets: map[string]string{"password": secret}})
	if err != nil {
		t.Fatal(err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := linesWith(logs, "request=", "capped to 30 characters"); n != 1 {
		t.Errorf("%d capped request lines, want 1:\n%s", n, logs)
	}
	if n := linesWith(logs, "response=", "capped to 30 characters"); n != 1 {
		t.Errorf("%d capped response lines, want 1:\n%s", n, logs)
	}
	if strings.Contains(logs, strings.Repeat("v", 40)) || strings.Contains(logs, strings.Repeat("d", 40)) {
		t.Errorf("a logged message is longer than the cap:\n%s", logs)
	}
	if strings.Contains(logs, secret) {
		t.Fatalf("secret value found in the log:\n%s", logs)
	}
}

// publishUnpublishLogged makes a publish the fake driver refuses, a
// publish that succeeds and an unpublish, of vols in that order, each with
// secret among its secrets, logging at verbosity v, and returns the log.
func publishUnpublishLogged(t *testing.T, v int, secret string, vols [3]string) string {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(v), ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	d := &fakeDriver{publishErr: status.Error(codes.Internal, "backend down")}
	c := connectFake(t, ctx, d, Options{})
	secrets := map[string]string{"password": secret}
	_, _ = c.ControllerPublish(ctx, PublishRequest{VolumeID: vols[0], NodeID: "node-1", Secrets: secrets})
	d.publishErr = nil
	_, _ = c.ControllerPublish(ctx, PublishRequest{VolumeID: vols[1], NodeID: "node-1", Secrets: secrets})
	_ = c.ControllerUnpublish(ctx, vols[2], "node-1", secrets)
	return logger.GetSink().(ktesting.Underlier).GetBuffer().String()
}
