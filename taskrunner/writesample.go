package taskrunner

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// A command may report its progress fifty times a second for days: stored
// as it comes, that is millions of rows a task. So PROGRESS and CHECKPOINT
// lines are sampled. One is queued at once when none was queued for
// sampleEvery (config.ProgressInterval); a line that comes sooner is held,
// replaced by any newer one, and queued when the interval is up. Whatever
// is held is queued before the attempt's outcome, so the newest checkpoint
// is the one a retry resumes from. Between the samples, the context's
// latest progress is set at most every progressEvery, so that the view and
// the status page follow a task closely at a cost of one small UPDATE a
// second, while the PROGRESS events keep a history whose size grows with
// the task's duration, not its chatter.

// sampled returns the suffixes that are sampled, in the order their held
// lines are queued before an outcome.
func sampled() []string { return []string{protocol.EventProgress, protocol.EventCheckpoint} }

// progressEvery is the least time between two writes of the context's
// latest progress (etlcontext.SetProgress) between the PROGRESS events.
const progressEvery = time.Second

// sample is what the writer holds of one sampled suffix; guarded by
// writer.mu.
type sample struct {
	// held is the newest line held back, nil when none is.
	held *pendingEvent
	// queuedAt is when a line of the suffix was last queued.
	queuedAt time.Time
	// timer queues held when the interval is up; nil when none runs.
	timer *time.Timer
}

// contextProgress is the newest progress not yet on the context; guarded
// by writer.mu.
type contextProgress struct {
	// payload is nil when the context has the newest progress (set by the
	// PROGRESS event that carried it, or by SetProgress).
	payload json.RawMessage
	// setAt is when the context's progress was last set or a PROGRESS
	// event queued.
	setAt time.Time
	// due: progressEvery has passed since setAt, so payload is written at
	// the writer's next chance.
	due bool
	// timer marks it due; nil when none runs.
	timer *time.Timer
	// off: the database refused SetProgress for good (a schema not yet
	// migrated, a role without the right): the events alone carry it.
	off bool
	// gen counts the changes of payload: a write that failed sets its
	// payload again only if none came since.
	gen uint64
}

// hold holds e, a line of a sampled suffix, back when one of its suffix
// was queued less than sampleEvery ago, and reports whether it did; w.mu
// is held.
func (w *writer) hold(e *pendingEvent) bool {
	if w.sampleEvery <= 0 {
		return false
	}
	s := w.samples[e.coalesce]
	if s == nil {
		s = &sample{}
		w.samples[e.coalesce] = s
	}
	now := time.Now()
	if s.held == nil && now.Sub(s.queuedAt) >= w.sampleEvery {
		s.queuedAt = now
		if e.coalesce == protocol.EventProgress {
			w.progress.payload, w.progress.setAt, w.progress.due = nil, now, false
			w.progress.gen++
		}
		return false
	}
	s.held = e
	if s.timer == nil {
		suffix := e.coalesce
		var t *time.Timer
		// t is read under w.mu, once hold (which holds it) has set it.
		t = time.AfterFunc(s.queuedAt.Add(w.sampleEvery).Sub(now), func() { w.release(suffix, &t) })
		s.timer = t
	}
	if e.coalesce == protocol.EventProgress {
		w.holdProgress(asRaw(e.ev.Payload), now)
	}
	return true
}

// holdProgress notes payload as the newest progress, to be set on the
// context within progressEvery; w.mu is held.
func (w *writer) holdProgress(payload json.RawMessage, now time.Time) {
	p := &w.progress
	if p.off {
		return
	}
	if payload == nil {
		payload = json.RawMessage("null")
	}
	p.payload = payload
	p.gen++
	switch wait := p.setAt.Add(progressEvery).Sub(now); {
	case wait <= 0:
		p.due = true
		w.signal()
	case p.timer == nil:
		var t *time.Timer
		t = time.AfterFunc(wait, func() {
			w.mu.Lock()
			if w.progress.timer == t {
				w.progress.timer, w.progress.due = nil, true
			}
			w.mu.Unlock()
			w.signal()
		})
		p.timer = t
	}
}

// release queues the line of suffix held back, once its interval is up,
// unless the timer *t was stopped meanwhile (the line was queued already).
func (w *writer) release(suffix string, t **time.Timer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.samples[suffix]
	if s.timer != *t {
		return
	}
	s.timer = nil
	w.queueHeld(suffix, s)
}

// releaseCheckpoint queues the checkpoint held back, if any, ahead of an
// event that is not sampled: what the command reported after a checkpoint
// (a child, a named event) is never stored before it, so that a retry
// never resumes from before what the stored events say was done; w.mu is
// held.
func (w *writer) releaseCheckpoint() {
	if s := w.samples[protocol.EventCheckpoint]; s != nil && s.held != nil {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		w.queueHeld(protocol.EventCheckpoint, s)
	}
}

// releaseAll queues every line held back, at once: nothing is held past the
// outcome; w.mu is held.
func (w *writer) releaseAll() {
	for _, suffix := range sampled() {
		if s := w.samples[suffix]; s != nil {
			if s.timer != nil {
				s.timer.Stop()
				s.timer = nil
			}
			w.queueHeld(suffix, s)
		}
	}
}

// queueHeld queues the line s holds back, if any; w.mu is held.
func (w *writer) queueHeld(suffix string, s *sample) {
	if s.held == nil {
		return
	}
	e := s.held
	s.held, s.queuedAt = nil, time.Now()
	if suffix == protocol.EventProgress {
		// The event sets the context's progress.
		w.progress.payload, w.progress.setAt, w.progress.due = nil, s.queuedAt, false
		w.progress.gen++
	}
	w.append(e)
}

// serveProgress sets the context's latest progress when it is due and
// nothing else waits; it reports false when there was nothing to do.
func (w *writer) serveProgress(ctx context.Context) bool {
	w.mu.Lock()
	p := &w.progress
	if p.payload == nil || !p.due || p.off {
		w.mu.Unlock()
		return false
	}
	payload, gen := p.payload, p.gen
	p.payload, p.due, p.setAt = nil, false, time.Now()
	id, runID := w.contextID, w.runID
	w.mu.Unlock()
	err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.SetProgress(ctx, conn, id, runID, payload)
	})
	// again sets payload anew unless something newer was noted meanwhile
	// (a newer line, or a PROGRESS event queued, which carries its own).
	again := func(due bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if p.gen != gen {
			return
		}
		if due {
			p.payload, p.due = payload, true
			return
		}
		w.holdProgress(payload, time.Now())
	}
	kind := classifyWriteError(err, w.conn)
	switch {
	case err == nil || ctx.Err() != nil:
	case kind == connectionLost:
		w.retry(ctx, err) // closes the connection, to be made again
		again(true)
	case kind == serverBusy && !strings.HasPrefix(etlcontext.ErrCode(err), "42"):
		// Refused for now (a timeout, a read-only server): set a second
		// later.
		again(false)
	case kind == statementError && !strings.HasPrefix(etlcontext.ErrCode(err), "42"):
		// This payload is refused: the next one may not be.
		w.logger.Warn("the database refused the task's latest progress", "error", err)
	default:
		// A schema not yet migrated, a role without the right (class 42):
		// the PROGRESS events still carry it, every progress_interval.
		w.logger.Warn("the database refused the task's latest progress; from now on only its PROGRESS events record it", "error", err)
		w.mu.Lock()
		p.off, p.payload = true, nil
		w.mu.Unlock()
	}
	return true
}
