package diagnose

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

type coordLease = coordinationv1.Lease

func renewed(l *coordinationv1.Lease) time.Time {
	switch {
	case l.Spec.RenewTime != nil:
		return l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		return l.Spec.AcquireTime.Time
	}
	return time.Time{}
}

// age formats now-t the way kubectl does (2m30s, 5h, 3d), rounding down.
func age(now, t time.Time) string {
	return HumanDuration(now.Sub(t))
}

func ageOrNever(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return age(now, t)
}

// HumanDuration is kubectl's short duration format, good enough for ages.
func HumanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 10*time.Minute:
		m := int(d.Minutes())
		if s := int(d.Seconds()) % 60; s != 0 {
			return fmt.Sprintf("%dm%ds", m, s)
		}
		return fmt.Sprintf("%dm", m)
	case d < 3*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
