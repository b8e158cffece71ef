package main

import "testing"

func TestProcsFor_environmentThenQuotaThenFlag(t *testing.T) {
	for _, tc := range []struct {
		name       string
		env        string
		automax    bool
		maxProcs   int
		wantProcs  int
		wantSource string
	}{
		{"default", "", false, DefaultMaxProcs, 1, procsFromFlag},
		{"flag", "", false, 4, 4, procsFromFlag},
		{"flag zero keeps Go's default", "", false, 0, 0, procsFromGo},
		{"automaxprocs wins over the flag", "", true, 4, 0, procsFromQuota},
		{"environment wins over everything", "8", true, 4, 0, procsFromEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			procs, source := procsFor(tc.env, tc.automax, tc.maxProcs)
			if procs != tc.wantProcs || source != tc.wantSource {
				t.Errorf("procsFor(%q, %v, %d) = %d, %q; want %d, %q", tc.env, tc.automax, tc.maxProcs, procs, source, tc.wantProcs, tc.wantSource)
			}
		})
	}
}

func TestParseOptions_maxProcsDefaultsToOneAndRejectsNegative(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.maxProcs != 1 {
		t.Errorf("max-procs = %d, want 1", o.maxProcs)
	}
	if _, err := parseOptions([]string{"--max-procs=-1"}); err == nil {
		t.Error("--max-procs=-1 accepted, want an error naming the flag")
	}
}
