package taskrunner

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// A command may report its progress fifty times a second for days: millions
// of rows a task, stored as they come. So PROGRESS and CHECKPOINT lines are
// sampled: one is queued at once when none was for sampleEvery; a sooner one
// is held, replaced by any newer one, and queued when the interval is up or
// before the outcome (a retry resumes from the newest checkpoint). Between
// the samples the context's latest progress is set at most every
// progressEvery: the status page follows a task closely for one small UPDATE
// a second, while the events' history grows with the task's duration, not
// its chatter.

// progressEvery is the least time between two writes of the context's progress.
const progressEvery = time.Second

// sample is what the writer holds of one sampled suffix; guarded by w.mu.
type sample struct {
	held     *pendingEvent // the newest line held back, if any
	queuedAt time.Time     // when a line of the suffix was last queued (append)
	timer    *time.Timer   // queues held when the interval is up, if running
}

// contextProgress is the newest progress not yet on the context; guarded by w.mu.
type contextProgress struct {
	// payload is nil when the context has the newest progress (set by the
	// PROGRESS event that carried it, or by SetProgress).
	payload json.RawMessage
	setAt   time.Time // when the context's progress was last set or a PROGRESS event queued
	// due: progressEvery has passed since setAt, so payload is written at
	// the writer's next chance; timer marks it due, nil when none runs.
	due   bool
	timer *time.Timer
	off   bool   // refused for good: the events alone carry the progress
	gen   uint64 // changes of payload: a failed write sets its own again only if none came
}

// hold holds e back when its suffix was queued less than sampleEvery ago; w.mu is held.
func (w *writer) hold(e *pendingEvent) bool {
	if w.sampleEvery <= 0 {
		return false
	}
	s := w.samples[e.coalesce]
	now := time.Now()
	if s.held == nil && now.Sub(s.queuedAt) >= w.sampleEvery {
		return false
	}
	s.held = e
	if s.timer == nil {
		suffix := e.coalesce
		var t *time.Timer
		t = time.AfterFunc(s.queuedAt.Add(w.sampleEvery).Sub(now), func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			// Unless stopped meanwhile: the line was queued already. t is
			// read under w.mu, once hold has set it.
			if s.timer == t {
				w.releaseHeld(suffix)
			}
		})
		s.timer = t
	}
	if e.coalesce == protocol.EventProgress {
		w.holdProgress(asRaw(e.ev.Payload), now)
	}
	return true
}

// holdProgress notes payload, to be set on the context within progressEvery; w.mu is held.
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

// releaseHeld queues the lines of suffixes held back at once; w.mu is held.
// The checkpoint goes ahead of any event that is not sampled, so that a
// retry never resumes from before what the stored events say was done.
func (w *writer) releaseHeld(suffixes ...string) {
	for _, suffix := range suffixes {
		s := w.samples[suffix]
		if s.held == nil {
			continue
		}
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		e := s.held
		s.held = nil
		w.append(e)
	}
}

// serveProgress sets the context's latest progress when due; false: nothing to do.
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
	switch kind := classifyWriteError(err, w.conn); {
	case err == nil || ctx.Err() != nil:
	case kind == connectionLost:
		w.retry(ctx, err) // closes the connection, to be made again
		again(true)
	case strings.HasPrefix(etlcontext.ErrCode(err), "42"):
		// A schema not yet migrated, a role without the right: the
		// PROGRESS events still carry it, every progress_interval.
		w.logger.Warn("the database refused the task's latest progress; from now on only its PROGRESS events record it", "error", err)
		w.mu.Lock()
		p.off, p.payload = true, nil
		w.mu.Unlock()
	case kind == serverBusy:
		// Refused for now (a timeout, a read-only server): a second later.
		again(false)
	default:
		// This payload is refused: the next one may not be.
		w.logger.Warn("the database refused the task's latest progress", "error", err)
	}
	return true
}
