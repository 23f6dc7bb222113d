package supervisor

import (
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
)

// The window runs on this process's clock from its first sight of a loss:
// seeing the same loss again does not restart it, a new loss does, and
// the database's mark is never read as a time.
func TestFenceClockTimesEachLossFromItsFirstSight(t *testing.T) {
	var f fenceClock
	// A mark from a database whose clock is an hour ahead.
	mark := time.Now().Add(time.Hour)
	if d := f.freeFor(1, mark); d > time.Second {
		t.Fatalf("first sight: free for %s", d)
	}
	start := time.Now()
	testWait(t, func() bool { return time.Since(start) >= 20*time.Millisecond })
	same := f.freeFor(1, mark)
	if same < 20*time.Millisecond {
		t.Errorf("same loss seen again: free for %s, want the time since its first sight", same)
	}
	if d := f.freeFor(1, mark.Add(time.Minute)); d >= same {
		t.Errorf("a new loss: free for %s, want it timed from now (the old one: %s)", d, same)
	}
	testWait(t, func() bool { return f.freeFor(1, mark.Add(time.Minute)) >= 20*time.Millisecond })
	f.forget(1)
	if d := f.freeFor(1, mark.Add(time.Minute)); d >= 20*time.Millisecond {
		t.Errorf("after forget: free for %s, want it timed from now", d)
	}
}

// testWait waits for cond, bounded.
func testWait(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the condition", func() (bool, error) { return cond(), nil })
}

// A sighting no step looks at any more (its context settled by another
// supervisor) is dropped, so the clock does not grow for ever.
func TestFenceClockDropsSightingsNobodyLooksAt(t *testing.T) {
	f := fenceClock{idle: 50 * time.Millisecond}
	mark := time.Now()
	f.freeFor(1, mark)
	testWait(t, func() bool {
		f.freeFor(2, mark)
		f.mu.Lock()
		defer f.mu.Unlock()
		_, kept := f.seen[1]
		return !kept
	})
	f.mu.Lock()
	_, kept := f.seen[2]
	f.mu.Unlock()
	if !kept {
		t.Error("the sighting looked at all along was dropped")
	}
}
