package diagnose

import (
	"fmt"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/kube"
)

func TestExplainUnreadable(t *testing.T) {
	s := NewSnapshot(now, drop[*coordLease](healthy(), "")...)
	s.Unreadable[Ref{Kind: RefLeaseList, Name: kube.LeaseName(drv)}] = "forbidden"
	s.Unreadable[Ref{Kind: RefEventList, Of: RefPod, Namespace: ns, Name: "web"}] = "forbidden"
	r := Explain(podWeb, s)
	checkExpect(t, r, expect{"attacher.lease", StatusInfo, []string{"could not read Leases", "forbidden"}})
	checkExpect(t, r, expect{"events", StatusInfo, []string{"could not read events"}})
	if !r.Healthy() {
		t.Errorf("a refused read must not be a problem:\n%s", dump(r))
	}
}

func runScenarios(t *testing.T, scenarios []scenario) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			target := sc.target
			if target.Kind == "" {
				target = podWeb
			}
			r := Explain(target, NewSnapshot(now, sc.objs...))
			for _, e := range sc.want {
				checkExpect(t, r, e)
			}
			for _, c := range sc.absent {
				for _, f := range r.Findings {
					if f.Check == c {
						t.Errorf("unexpected finding %s: %s\n%s", c, f.Message, dump(r))
					}
				}
			}
			if r.Healthy() != sc.healthy {
				t.Errorf("Healthy() = %v, want %v\n%s", r.Healthy(), sc.healthy, dump(r))
			}
			for _, f := range r.Findings {
				if (f.Status == StatusProblem || f.Status == StatusWaiting) && f.Hint == "" {
					t.Errorf("%s finding %s has no hint: %s", f.Status, f.Check, f.Message)
				}
			}
			// Fetching through Needs must reach the same report.
			if got := Explain(target, fetchLike(target, NewSnapshot(now, sc.objs...))); dump(got) != dump(r) {
				t.Errorf("report from a Needs-driven snapshot differs:\n%s\nwant:\n%s", dump(got), dump(r))
			}
		})
	}
}

func checkExpect(t *testing.T, r Report, e expect) {
	t.Helper()
	for _, f := range r.Findings {
		if f.Check != e.Check || f.Status != e.Status {
			continue
		}
		text := f.Object + " " + f.Message + " " + f.Hint
		ok := true
		for _, s := range e.Says {
			ok = ok && strings.Contains(text, s)
		}
		if ok {
			return
		}
	}
	t.Errorf("no %s finding %s saying %q\n%s", e.Status, e.Check, e.Says, dump(r))
}

func dump(r Report) string {
	var b strings.Builder
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "  %-8s %-22s %s: %s", f.Status, f.Check, f.Object, f.Message)
		if f.Hint != "" {
			fmt.Fprintf(&b, "\n  %31s next: %s", "", f.Hint)
		}
		b.WriteString("\n")
	}
	return b.String()
}
