package latchlocal

import (
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/csimock"
)

// The mock driver gets the backend model and the latency and failure
// rules the options name.
func TestMockConfigCarriesTheBackendAndTheFaultRules(t *testing.T) {
	b, err := csimock.ProfileBackend("slow-cloud")
	if err != nil {
		t.Fatal(err)
	}
	cfg := csimock.DefaultConfig()
	mockConfig(Options{Backend: &b, PublishLatency: 20 * time.Millisecond, PublishFailures: 2})(&cfg)
	if cfg.Backend == nil || cfg.Backend.Profile != "slow-cloud" {
		t.Errorf("backend = %+v, want slow-cloud", cfg.Backend)
	}
	if len(cfg.Faults) != 2 || cfg.Faults[0].ID != "publish-latency" || cfg.Faults[1].ID != "publish-failures" {
		t.Errorf("fault rules = %+v, want publish-latency and publish-failures", cfg.Faults)
	}
	cfg = csimock.DefaultConfig()
	mockConfig(Options{})(&cfg)
	if cfg.Backend != nil || len(cfg.Faults) != 0 {
		t.Errorf("no options gave backend %+v, rules %+v", cfg.Backend, cfg.Faults)
	}
}
