package main

import "testing"

// Without --leader-election the binary still announces itself on the
// driver's Lease (app.Presence): two replicas without leader election must
// not both work.
func TestLeaderConfigAnnouncesPresenceWithAndWithoutLeaderElection(t *testing.T) {
	for _, args := range [][]string{nil, {"--leader-election"}, {"--leader-election=false", "--leader-election-namespace=drv", "--leader-election-retry-period=2s"}} {
		o, err := parseOptions(args)
		if err != nil {
			t.Fatal(err)
		}
		c := leaderConfig(o)
		if c.Presence == nil || c.Presence.Component != "csi-attacher" {
			t.Errorf("%v: Presence = %+v, want set (component csi-attacher)", args, c.Presence)
		}
		if c.Enabled != o.Leader.Enabled || c.Namespace != o.Leader.Namespace || c.RetryPeriod != o.Leader.RetryPeriod || c.LeaseDuration != o.Leader.LeaseDuration || c.RenewDeadline != o.Leader.RenewDeadline {
			t.Errorf("%v: config %+v does not carry the flags", args, c)
		}
	}
}
