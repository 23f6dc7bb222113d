package taskrunner

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/dama-etl/dama/internal/hostproc"
)

// dropProgramPages gives back the program's pages (hostproc.ProgramPages),
// read again each time: a mapping that since got pages of the process's
// own (a uprobe's, a debugger's breakpoint) is left alone.
func dropProgramPages() (int, error) {
	pages, err := hostproc.FindProgramPages()
	if err != nil {
		return 0, err
	}
	return pages.Drop()
}

// afterCollections calls f delay after each collection of the heap, at most
// once every minGap, until done is closed (nil: never) or f returns false.
// The runner gives back the program's pages with it (dropProgramPages): a
// collection reads the
// tables of every function on every goroutine's stack, and the goroutines
// whose stacks it shrank read them again as they grow back, megabytes of
// the program's pages once fault-around is counted, which the runner then
// does not touch until the next collection. Relaying a chatty command's
// lines, a runner collects every few seconds; a quiet one, every two
// minutes (the runtime's own period).
func afterCollections(done <-chan struct{}, delay, minGap time.Duration, f func() bool) {
	var last time.Time
	var stopped atomic.Bool
	var arm func()
	arm = func() {
		// Unreachable at once: its finalizer runs after a collection that
		// finds it so (the next, or the one after when it was allocated
		// during one), on the runtime's finalizer goroutine, which must
		// not wait.
		runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
			select {
			case <-done:
				return
			default:
			}
			if stopped.Load() {
				return
			}
			if now := time.Now(); now.Sub(last) >= minGap {
				last = now
				time.AfterFunc(delay, func() {
					select {
					case <-done:
					default:
						if !f() {
							stopped.Store(true)
						}
					}
				})
			}
			arm()
		})
	}
	arm()
}

// gcSentinel holds a pointer: the allocator batches small objects without
// one, whose finalizers may never run.
type gcSentinel struct{ _ *byte }

// After a collection, the runner gives back the program's pages once the
// stacks the collection shrank have grown back (collectionSettle), at most
// every collectionDropGap: each time, it faults back the few pages it uses,
// a fraction of a millisecond.
const (
	collectionSettle  = time.Second
	collectionDropGap = 5 * time.Second
)
