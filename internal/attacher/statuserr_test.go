package attacher

import (
	"strings"
	"testing"
	"unicode/utf8"

	storagev1 "k8s.io/api/storage/v1"
)

func TestFitMessage(t *testing.T) {
	internal := int32(13)
	driverText := strings.Repeat("disk backend said ä no ", 300)
	cases := []struct {
		name      string
		msg       string
		code      *int32
		wantStart string
	}{
		{
			name: "short message: unchanged", msg: "rpc error: code = Internal desc = no", code: &internal,
			wantStart: "rpc error: code = Internal desc = no",
		},
		{
			name:      "5,000-byte driver error: our context, the code and the start of the driver's text stay",
			msg:       `ControllerPublishVolume volume "vol-1" on node "n-1": rpc error: code = Internal desc = ` + driverText,
			code:      &internal,
			wantStart: `ControllerPublishVolume volume "vol-1" on node "n-1": rpc error: code = Internal desc = disk backend said ä no`,
		},
		{
			name:      "context alone fills the room (a huge handle): the code goes in front",
			msg:       `ControllerPublishVolume volume "` + strings.Repeat("h", 2000) + `" on node "n-1": rpc error: code = Internal desc = x`,
			code:      &internal,
			wantStart: `code = Internal: ControllerPublishVolume volume "hhh`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := fitMessage(tc.msg, tc.code, maxVolumeErrorMessageBytes)
			if len(got) > maxVolumeErrorMessageBytes || !utf8.ValidString(got) {
				t.Fatalf("message of %d bytes (valid UTF-8: %v), limit %d", len(got), utf8.ValidString(got), maxVolumeErrorMessageBytes)
			}
			if !strings.HasPrefix(got, tc.wantStart) {
				t.Fatalf("message %q does not start with %q", got, tc.wantStart)
			}
			if truncated := len(tc.msg) > maxVolumeErrorMessageBytes; truncated != strings.Contains(got, "(truncated,") {
				t.Fatalf("truncation mark present = %v, want %v: %q", !truncated, truncated, got)
			}
		})
	}
	// Every cut lands on a rune boundary.
	for n := 990; n < 1030; n++ {
		if got := fitMessage(strings.Repeat("ä", n), nil, maxVolumeErrorMessageBytes); len(got) > maxVolumeErrorMessageBytes || !utf8.ValidString(got) {
			t.Fatalf("%d runes: %d bytes, valid %v", n, len(got), utf8.ValidString(got))
		}
	}
}

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
	if p := DecideAttach(obs, drv, nil); p.Blocked == nil || p.Blocked.Reason != ReasonPublishContextTooLarge || p.Publish {
		t.Fatalf("publish context too large recorded: plan = %+v, want Blocked PublishContextTooLarge, no publish", p)
	}
	obs.VA.Status.AttachError = &storagev1.VolumeError{Message: "rpc error: code = Internal desc = something else"}
	if p := DecideAttach(obs, drv, nil); p.Blocked != nil || !p.Publish {
		t.Fatalf("another attachError: plan = %+v, want a publish", p)
	}
	obs.VA.Status.AttachError = nil
	if p := DecideAttach(obs, drv, nil); p.Blocked != nil || !p.Publish {
		t.Fatalf("attachError cleared: plan = %+v, want a publish", p)
	}
}
