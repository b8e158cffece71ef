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

// The Pod's UID (POD_UID, from the downward API in the manifests) reaches
// presence mode, so that a restarted container recognises its previous
// process's Lease; without it the UID stays unknown.
func TestLeaderConfigTakesThePodUIDFromPOD_UID(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_UID", "")
	if c := leaderConfig(o); c.Presence.PodUID != "" {
		t.Errorf("without POD_UID: PodUID = %q, want empty", c.Presence.PodUID)
	}
	t.Setenv("POD_UID", "7c1e2f9a-0b3d-4e5f-8a6b-1c2d3e4f5a6b")
	if c := leaderConfig(o); c.Presence.PodUID != "7c1e2f9a-0b3d-4e5f-8a6b-1c2d3e4f5a6b" {
		t.Errorf("POD_UID set: PodUID = %q, want it", c.Presence.PodUID)
	}
}
