package supervisor

import (
	"sync"
	"time"
)

// fenceClock times, on this process's monotonic clock, how long the lock of
// each context's current attempt has been seen free, for the fencing
// window of an attempt on another host.
type fenceClock struct {
	mu sync.Mutex
	// seen holds, per context, the database's mark of the loss (which
	// changes when the task process takes its lock again and loses it
	// anew) and when this process first saw it.
	seen map[int64]fenceSighting
}

type fenceSighting struct {
	mark  time.Time
	since time.Time // with its monotonic reading
}

// freeFor returns how long this process has seen the loss named mark of
// context id's lock.
func (f *fenceClock) freeFor(id int64, mark time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = make(map[int64]fenceSighting)
	}
	s, ok := f.seen[id]
	if !ok || !s.mark.Equal(mark) {
		s = fenceSighting{mark: mark, since: time.Now()}
		f.seen[id] = s
	}
	return time.Since(s.since)
}

// forget drops what is known of context id: its attempt is settled.
func (f *fenceClock) forget(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.seen, id)
}
