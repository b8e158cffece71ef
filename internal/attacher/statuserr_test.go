package attacher

import (
	"strings"
	"testing"
	"unicode/utf8"
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
