package taskrunner

import (
	"testing"
	"time"
)

// The bounds docs/architecture.md states for the shipped defaults and the tests'
// settings.
func TestLockBounds(t *testing.T) {
	cases := []struct {
		heartbeat, silence time.Duration
	}{
		{5 * time.Second, 14 * time.Second},       // 5s idle + 3 probes 3s apart
		{200 * time.Millisecond, 4 * time.Second}, // the kernel counts whole seconds
		{time.Minute, 75 * time.Second},           // probes at most 5s apart
	}
	for _, c := range cases {
		if got := LockSilenceBound(c.heartbeat); got != c.silence {
			t.Errorf("LockSilenceBound(%s) = %s, want %s", c.heartbeat, got, c.silence)
		}
	}
	if got := FenceWindow(5*time.Second, 2*time.Minute, 10*time.Second, 5*time.Second); got != 146*time.Second {
		t.Errorf("FenceWindow with the defaults = %s, want 146s", got)
	}
	if got := FenceWindow(200*time.Millisecond, 0, time.Second, time.Minute); got != 122*time.Second {
		t.Errorf("FenceWindow with a long poll interval = %s, want 2 x poll + 2s", got)
	}
}
