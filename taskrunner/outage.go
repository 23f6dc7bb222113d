package taskrunner

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// outageReminder is how often a long outage is said again.
const outageReminder = 5 * time.Minute

// outage makes the loss of the database two lines of the task's log, as it
// is two of the supervisor's: one when a connection of the runner's is first
// lost, one when every one lost is back, rather than a warning for each try
// to connect again, several a second for as long as it lasts.
type outage struct {
	logger *slog.Logger
	// grace is reconnect_grace: how long the command runs on without its
	// lock.
	grace time.Duration
	// reports returns how many events the writer wrote so far, and how
	// many wait.
	reports func() (written, waiting int)

	// on is whether an outage is on (since is set).
	on atomic.Bool
	mu sync.Mutex
	// since is when the outage began, zero when there is none; saidAt
	// when it was last said; written, reports' count then.
	since, saidAt time.Time
	written       int
	// down is what is lost and awaited: "lock", "writes".
	down map[string]bool
}

// lost reports that part lost the database, with err.
func (o *outage) lost(part string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down[part] = true
	switch {
	case o.since.IsZero():
		o.since, o.saidAt = time.Now(), time.Now()
		o.on.Store(true)
		o.written, _ = o.reports()
		msg := "lost the database: the command keeps running; reporting again once it is back"
		if o.grace == 0 {
			msg = "lost the database: reporting again once it is back"
		}
		// A warning: the task rides it out, and ends only past reconnect_grace.
		o.logger.Warn(msg, "error", err, "reconnect_grace", o.grace)
	case time.Since(o.saidAt) >= outageReminder:
		o.saidAt = time.Now()
		o.logger.Warn("database still unreachable", "for", time.Since(o.since).Round(time.Second), "error", err)
	}
}

// back reports that part is connected again: the last one back ends the
// outage.
func (o *outage) back(part string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.down, part)
	o.end()
}

// forget reports that part is no longer awaited (the row-mode lock, once
// the command ended): the outage ends at the next write that passes.
func (o *outage) forget(part string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.down, part)
}

// wrote reports a statement of the writer's that passed.
func (o *outage) wrote() {
	if !o.on.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.end()
}

// end ends the outage, once nothing awaited is down; o.mu is held.
func (o *outage) end() {
	if o.since.IsZero() || len(o.down) > 0 {
		return
	}
	// Those that wait are sent next, on the connection just made.
	written, waiting := o.reports()
	o.logger.Info(fmt.Sprintf("database back after %s: %d reports sent", time.Since(o.since).Round(100*time.Millisecond), written-o.written+waiting))
	o.since = time.Time{}
	o.on.Store(false)
}
