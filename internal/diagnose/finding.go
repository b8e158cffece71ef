package diagnose

import "fmt"

// Status is the verdict of one check.
type Status string

const (
	// StatusOK means this step of the pipeline is done.
	StatusOK Status = "ok"
	// StatusWaiting means the step is in progress or waits for another
	// step; nothing looks broken yet.
	StatusWaiting Status = "waiting"
	// StatusProblem means the step cannot complete without somebody
	// acting; Hint says what to do.
	StatusProblem Status = "problem"
	// StatusInfo is evidence that is neither good nor bad: a recent event,
	// a note about migration, a check that could not run for lack of
	// permissions.
	StatusInfo Status = "info"
)

// Finding is one line of an explanation.
type Finding struct {
	// Check is a stable identifier ("pvc.bound", "va.attached") that
	// scripts can match on; the wording of Message may change.
	Check string `json:"check"`
	// Object is the object the finding is about, "Kind namespace/name".
	Object  string `json:"object,omitempty"`
	Status  Status `json:"status"`
	Message string `json:"message"`
	// Hint is the next step for waiting and problem findings.
	Hint string `json:"hint,omitempty"`
}

// Report is the result of Explain.
type Report struct {
	Target   Target    `json:"target"`
	Findings []Finding `json:"findings"`
}

// Problems counts the findings with StatusProblem.
func (r Report) Problems() int { return r.count(StatusProblem) }

// Waiting counts the findings with StatusWaiting.
func (r Report) Waiting() int { return r.count(StatusWaiting) }

func (r Report) count(s Status) int {
	n := 0
	for _, f := range r.Findings {
		if f.Status == s {
			n++
		}
	}
	return n
}

// Healthy reports whether no finding is a problem. Waiting findings do not
// make a report unhealthy: an attach that is in progress is not broken.
func (r Report) Healthy() bool { return r.Problems() == 0 }

// Summary is one line for the end of a text report.
func (r Report) Summary() string {
	p, w := r.Problems(), r.Waiting()
	switch {
	case p > 0:
		return fmt.Sprintf("%s found; %d waiting", plural(p, "problem"), w)
	case w > 0:
		return fmt.Sprintf("no problem found; %d step(s) still waiting", w)
	default:
		return "no problem found"
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
