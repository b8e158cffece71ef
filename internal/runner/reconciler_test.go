package runner

import (
	"errors"
	"fmt"
	"testing"
)

func TestTerminal(t *testing.T) {
	base := errors.New("invalid volume source")
	tests := []struct {
		name     string
		err      error
		terminal bool
	}{
		{"nil", nil, false},
		{"plain error", base, false},
		{"terminal", Terminal(base), true},
		{"terminal wrapped by caller", fmt.Errorf("attach va-1: %w", Terminal(base)), true},
		{"joined", errors.Join(errors.New("x"), Terminal(base)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsTerminal(tt.err); got != tt.terminal {
				t.Fatalf("IsTerminal(%v) = %v, want %v", tt.err, got, tt.terminal)
			}
		})
	}
	if Terminal(nil) != nil {
		t.Fatal("Terminal(nil) must be nil")
	}
	if err := Terminal(base); !errors.Is(err, base) || err.Error() != base.Error() {
		t.Fatalf("Terminal must wrap transparently, got %v", err)
	}
}
