package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// Lines split across writes are read whole; subtests and other actions
// do not count; a skip is not a pass.
func TestEventsTableAndVerdict(t *testing.T) {
	r := &eventReader{}
	w := &teeLines{w: io.Discard, r: r}
	for _, chunk := range []string{
		`{"Action":"run","Test":"TestA"}` + "\n" + `{"Action":"pass","Test":"TestA/sub","Elapsed":1}` + "\n" + `{"Action":"pa`,
		`ss","Test":"TestA","Elapsed":41.2}` + "\n",
		`{"Action":"fail","Test":"TestB","Elapsed":62}` + "\n" + `{"Action":"output","Test":"TestC","Output":"x"}` + "\n",
		// A test whose subtests are parallel says 0s: its time is from
		// its run to its outcome.
		`{"Time":"2026-11-29T00:07:28Z","Action":"run","Test":"TestD"}` + "\n" + `{"Time":"2026-11-29T00:09:58Z","Action":"pass","Test":"TestD","Elapsed":0}` + "\n",
	} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	got := r.results()
	if len(got) != 3 || got["TestA"] != (result{"pass", 41200 * time.Millisecond}) || got["TestB"].Action != "fail" || got["TestD"] != (result{"pass", 150 * time.Second}) {
		t.Fatalf("results = %+v", got)
	}
	chosen := []scenario{{"a", "scenario A", "./test/x/", "TestA"}, {"b", "scenario B", "./test/x/", "TestB"}, {"c", "scenario C", "./test/y/", "TestC"}}
	cols := []column{
		{Release: testsupport.KubernetesRelease{Minor: "1.34", Version: "v1.34.5"}, Build: 9 * time.Minute, Total: 12 * time.Minute, Results: got},
		{Release: testsupport.KubernetesRelease{Minor: "1.35", Version: "v1.35.4"}, Build: 3 * time.Second, BuildErr: errors.New("x"), Total: 3 * time.Second, Results: map[string]result{}},
	}
	table := renderTable(chosen, cols)
	for _, want := range []string{
		"| scenario | test | 1.34 (v1.34.5) | 1.35 (v1.35.4) |",
		"| scenario A | `test/x` TestA | pass 41s | not run |",
		"| scenario B | `test/x` TestB | FAIL 1m02s | not run |",
		"| scenario C | `test/y` TestC | not run | not run |",
		"| upstream binaries | build, or kept from an earlier run | 9m00s | FAIL 3s |",
	} {
		if !strings.Contains(table, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if allPassed(chosen, cols) {
		t.Error("allPassed with failures")
	}
	skipped := []column{{Results: map[string]result{"TestA": {"skip", 0}}}}
	if allPassed(chosen[:1], skipped) {
		t.Error("a skipped scenario counted as passed")
	}
	if !allPassed(chosen[:1], []column{{Results: got}}) {
		t.Error("a passed scenario counted as failed")
	}
}
