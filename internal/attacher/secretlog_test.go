package attacher

import (
	"context"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

func TestSecretReadContextDropsClientGoDumpsButKeepsLowVerbosityLogs(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(10), ktesting.BufferLogs(true)))
	ctx := withoutAPIDumps(klog.NewContext(context.Background(), logger.WithValues("volumeAttachment", "va-1")))
	quiet := klog.FromContext(ctx)

	for v := 0; v < apiDumpVerbosity; v++ {
		if !quiet.V(v).Enabled() {
			t.Errorf("V(%d) disabled, want enabled below the client-go dump levels", v)
		}
	}
	for v := apiDumpVerbosity; v <= 10; v++ {
		if quiet.V(v).Enabled() {
			t.Errorf("V(%d) enabled at -v=10, want disabled: client-go dumps request details there", v)
		}
	}
	quiet.V(8).Info("Response Body", "body", "secret-data")
	quiet.WithName("sub").WithValues("k", "v").V(9).Info("Request Body", "body", "secret-data")
	quiet.V(2).Info("kept message")

	underlier, ok := logger.GetSink().(ktesting.Underlier)
	if !ok {
		t.Fatal("ktesting sink does not expose its buffer")
	}
	out := underlier.GetBuffer().String()
	if want := "kept message"; !strings.Contains(out, want) {
		t.Errorf("log %q lacks %q", out, want)
	}
	if strings.Contains(out, "secret-data") {
		t.Errorf("log contains dumped data: %q", out)
	}
	if !logger.V(9).Enabled() {
		t.Error("the original logger lost its verbosity")
	}
}
