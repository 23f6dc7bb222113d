package taskrunner

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// collectUntil collects the heap until calls reaches want, or fails t.
func collectUntil(t *testing.T, calls *atomic.Int32, want int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls after the collections, want %d", calls.Load(), want)
		}
		runtime.GC()
		time.Sleep(time.Millisecond) // deliberately: lets the finalizer goroutine run
	}
}

// collectMore collects the heap a few times and lets the finalizers and
// timers that would follow run, for a test that nothing more is called.
func collectMore(n int) {
	for range n {
		runtime.GC()
	}
	time.Sleep(50 * time.Millisecond) // deliberately: lets them run, if they would
}

// f runs after a collection, once per collection, and never once done is
// closed.
func TestAfterCollectionsRunsAfterEachCollectionUntilDone(t *testing.T) {
	var calls atomic.Int32
	done := make(chan struct{})
	afterCollections(done, 0, 0, func() bool { calls.Add(1); return true })
	collectUntil(t, &calls, 1)
	collectUntil(t, &calls, 2)
	close(done)
	after := calls.Load()
	collectMore(5)
	// The finalizer and timer of a collection before done may still fire
	// once; none after it.
	if got := calls.Load(); got > after+1 {
		t.Fatalf("%d calls after done was closed, want at most %d", got, after+1)
	}
}

func TestAfterCollectionsWaitsMinGapBetweenCalls(t *testing.T) {
	var calls atomic.Int32
	done := make(chan struct{})
	defer close(done)
	afterCollections(done, 0, time.Hour, func() bool { calls.Add(1); return true })
	collectUntil(t, &calls, 1)
	collectMore(20)
	if got := calls.Load(); got != 1 {
		t.Fatalf("%d calls within minGap, want 1", got)
	}
}

func TestAfterCollectionsStopsWhenFSaysSo(t *testing.T) {
	var calls atomic.Int32
	afterCollections(nil, 0, 0, func() bool { calls.Add(1); return false })
	collectUntil(t, &calls, 1)
	collectMore(5)
	// A collection's finalizer may have armed one more call before f said
	// to stop.
	if got := calls.Load(); got > 2 {
		t.Fatalf("%d calls after f returned false, want at most 2", got)
	}
}
