package app

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestComponentConfigSpeaksProtobufUnlessTheBaseNamesAFormat(t *testing.T) {
	base := &rest.Config{Host: "https://127.0.0.1:6443", QPS: 7}
	got := ComponentConfig(base, "csi-attacher")
	if got.ContentType != "application/vnd.kubernetes.protobuf" {
		t.Errorf("ContentType = %q, want protobuf", got.ContentType)
	}
	if got.AcceptContentTypes != "application/vnd.kubernetes.protobuf,application/json" {
		t.Errorf("AcceptContentTypes = %q, want protobuf then JSON", got.AcceptContentTypes)
	}
	if !strings.HasSuffix(got.UserAgent, "/csi-attacher") || got.QPS != 7 || got.Host != base.Host {
		t.Errorf("config = %+v, want the base's host and QPS with the component's user agent", got)
	}
	if base.ContentType != "" || base.UserAgent != "" {
		t.Errorf("base was changed: %+v", base)
	}

	base.ContentType = "application/json"
	got = ComponentConfig(base, "csi-attacher")
	if got.ContentType != "application/json" || got.AcceptContentTypes != "" {
		t.Errorf("with --kube-api-content-type=application/json: ContentType %q, Accept %q; want JSON only", got.ContentType, got.AcceptContentTypes)
	}
}

func TestValidateContentTypeNamesTheFlagAndTheValue(t *testing.T) {
	for _, ok := range []string{"application/vnd.kubernetes.protobuf", "application/json"} {
		if err := ValidateContentType(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	err := ValidateContentType("application/cbor")
	if err == nil || !strings.Contains(err.Error(), "--kube-api-content-type") || !strings.Contains(err.Error(), "application/cbor") {
		t.Errorf("application/cbor: error %v", err)
	}
}
