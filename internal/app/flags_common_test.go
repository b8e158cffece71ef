package app

import (
	"strings"
	"testing"
	"time"
)

func TestLabelsValue_acceptsExternalAttachersKeyColonValueAndKeyEqualsValue(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   string
	}{
		{[]string{"app:foo"}, "app:foo"},
		{[]string{"app:foo,b:c"}, "app:foo,b:c"},
		{[]string{"my-label:my-value,my-second-label:my-second-value"}, "my-label:my-value,my-second-label:my-second-value"},
		{[]string{"example.com/owner:team-a"}, "example.com/owner:team-a"},
		{[]string{"app=foo,b:c"}, "app:foo,b:c"},
		{[]string{"app:foo", "b:c"}, "app:foo,b:c"},
		{[]string{"app:foo,"}, "app:foo"},
		{[]string{"empty:"}, "empty:"},
	} {
		l := LabelsValue{}
		for _, v := range tc.values {
			if err := l.Set(v); err != nil {
				t.Fatalf("Set(%q): %v", v, err)
			}
		}
		if got := l.String(); got != tc.want {
			t.Errorf("%q: labels %s, want %s", tc.values, got, tc.want)
		}
	}
}

func TestLabelsValue_refusesMalformedLabelsNamingThem(t *testing.T) {
	for value, want := range map[string]string{
		"app":         `label "app": want key:value`,
		"a:b:c":       `label "a:b:c": want key:value`,
		"a=b:c":       `label "a=b:c": key "a=b"`,
		"a=b=c":       `label "a=b=c": want key:value`,
		"bad key:x":   `label "bad key:x": key "bad key"`,
		"ok:bad val!": `label "ok:bad val!": value "bad val!"`,
	} {
		err := LabelsValue{}.Set(value)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set(%q): error %v, want one containing %q", value, err, want)
		}
	}
}

func TestFlags_sharedFlagsParseAndCheck(t *testing.T) {
	newFlags := func() (*Flags, *ClientOptions, *LeaderElection) {
		f, err := NewFlags("x", "gates")
		if err != nil {
			t.Fatal(err)
		}
		c := &ClientOptions{QPS: 7, Burst: 9}
		le := &LeaderElection{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
		f.AddClientFlags(c)
		f.AddLeaderFlags("leader-elect", le)
		return f, c, le
	}
	f, c, le := newFlags()
	if err := f.Parse([]string{"--kube-api-qps=3", "--leader-elect", "--leader-elect-retry-period=1s"}); err != nil {
		t.Fatal(err)
	}
	if c.QPS != 3 || c.Burst != 9 || c.ContentType != DefaultContentType || !le.Enabled || le.RetryPeriod != time.Second || le.LeaseDuration != 15*time.Second {
		t.Errorf("parsed %+v %+v", c, le)
	}
	f, _, _ = newFlags()
	if err := f.Parse([]string{"--kube-api-content-type=text/plain"}); err == nil || !strings.Contains(err.Error(), "--kube-api-content-type") {
		t.Errorf("bad content type: error %v, want one naming the flag", err)
	}
	f, _, _ = newFlags()
	err := f.Parse([]string{"--leader-elect", "--leader-elect-renew-deadline=20s"})
	if err == nil || !strings.Contains(err.Error(), "--leader-elect-renew-deadline (20s) must be less than --leader-elect-lease-duration (15s)") {
		t.Errorf("renew deadline over lease duration: error %v", err)
	}
	f, _, _ = newFlags()
	if err := f.Parse([]string{"--leader-elect=false", "--leader-elect-renew-deadline=20s"}); err != nil {
		t.Errorf("renew deadline is not checked without election: %v", err)
	}
}
