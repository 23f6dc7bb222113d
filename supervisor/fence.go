package supervisor

import (
	"cmp"
	"maps"
	"sync"
	"time"
)

// fenceClock times, on this process's monotonic clock, how long the lock of
// each context's current attempt has been seen free, for the fencing
// window of an attempt on another host.
type fenceClock struct {
	mu sync.Mutex
	// seen holds, per context, the database's mark of the loss (new at each
	// loss) and when this process first saw it.
	seen map[int64]fenceSighting
	// idle is how long a sighting no step looked at is kept (fenceIdle by
	// default): one whose context another supervisor settled would stay
	// forever. Dropping one that matters only makes a wait longer.
	idle      time.Duration
	lastSweep time.Time
}

// fenceIdle is far longer than any fencing window, through which a waiting
// step looks again at least every poll interval.
const fenceIdle = time.Hour

type fenceSighting struct {
	mark     time.Time
	since    time.Time // with its monotonic reading
	lastLook time.Time
}

// freeFor returns how long this process has seen the loss named mark of
// context id's lock.
func (f *fenceClock) freeFor(id int64, mark time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = make(map[int64]fenceSighting)
	}
	now := time.Now()
	idle := cmp.Or(f.idle, fenceIdle)
	if now.Sub(f.lastSweep) >= idle {
		f.lastSweep = now
		maps.DeleteFunc(f.seen, func(_ int64, s fenceSighting) bool { return now.Sub(s.lastLook) >= idle })
	}
	s, ok := f.seen[id]
	if !ok || !s.mark.Equal(mark) {
		s = fenceSighting{mark: mark, since: now}
	}
	s.lastLook = now
	f.seen[id] = s
	return now.Sub(s.since)
}

// forget drops what is known of context id: its attempt is settled.
func (f *fenceClock) forget(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.seen, id)
}
