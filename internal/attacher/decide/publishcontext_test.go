package decide

import (
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
)

func TestCheckPublishContext(t *testing.T) {
	if b := CheckPublishContext(map[string]string{"devicePath": "/dev/x"}); b != nil {
		t.Fatalf("small publish context blocked: %v", b)
	}
	exact := map[string]string{"k": strings.Repeat("x", MaxAttachmentMetadataBytes-1)}
	if b := CheckPublishContext(exact); b != nil {
		t.Fatalf("publish context of exactly the limit blocked: %v", b)
	}
	big := map[string]string{"k": strings.Repeat("x", MaxAttachmentMetadataBytes)}
	b := CheckPublishContext(big)
	if b == nil || b.Reason != ReasonPublishContextTooLarge || !strings.Contains(b.Message, "262145 bytes") {
		t.Fatalf("oversized publish context: %+v, want PublishContextTooLarge naming 262145 bytes", b)
	}
}

func TestDecideAttachAfterOversizedPublishContext(t *testing.T) {
	tooLarge := CheckPublishContext(map[string]string{"k": strings.Repeat("x", MaxAttachmentMetadataBytes+1)})
	withError := func(va *storagev1.VolumeAttachment) {
		va.Status.AttachError = &storagev1.VolumeError{Message: tooLarge.Message}
	}
	obs := Observed{VA: testVA(recorded, withError), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)}
	if p := Attach(obs, drv, nil); p.Blocked == nil || p.Blocked.Reason != ReasonPublishContextTooLarge || p.Publish {
		t.Fatalf("publish context too large recorded: plan = %+v, want Blocked PublishContextTooLarge, no publish", p)
	}
	obs.VA.Status.AttachError = &storagev1.VolumeError{Message: "rpc error: code = Internal desc = something else"}
	if p := Attach(obs, drv, nil); p.Blocked != nil || !p.Publish {
		t.Fatalf("another attachError: plan = %+v, want a publish", p)
	}
	obs.VA.Status.AttachError = nil
	if p := Attach(obs, drv, nil); p.Blocked != nil || !p.Publish {
		t.Fatalf("attachError cleared: plan = %+v, want a publish", p)
	}
}
