package taskrunner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// serveEvents writes the queue's head: a child alone, or a batch (nextBatch).
func (w *writer) serveEvents(ctx context.Context) bool {
	w.mu.Lock()
	w.dropThrough(nil)
	if len(w.events) == 0 {
		w.mu.Unlock()
		return true
	}
	if e := w.events[0]; e.child != nil {
		e.attempted = true
		w.mu.Unlock()
		return w.serveChild(ctx, e)
	}
	batch, evs := w.nextBatch()
	w.mu.Unlock()

	last := batch[len(batch)-1]
	var log *etlcontext.LogChunk
	if last.outcome {
		log = w.lastOfTail()
	}
	err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.AppendEvents(ctx, conn, evs, log)
	})
	t := w.tail.Load()
	if log != nil && err == nil {
		t.sent()
	}
	refused := err != nil && !retriable(err, w.conn) && !errors.Is(err, etlcontext.ErrStaleRun) && !errors.Is(err, etlcontext.ErrFinished)
	switch {
	case log != nil && refused:
		// Refused for good, the events or the tail: the outcome is tried
		// alone, which tells which.
		t.aside = err
		return true
	case last.outcome && t != nil && t.aside != nil && (err == nil || refused):
		if err == nil {
			// The tail was at fault (a role without the right to
			// append_log): the log file keeps it, and it holds no outcome back.
			w.tailRefused(t, t.aside)
		}
		// Else the events were: the tail goes with them when they are
		// tried again.
		t.aside = nil
	}
	if w.retry(ctx, err) {
		// A batch cut short (a timeout, short of memory) is smaller next time.
		w.mu.Lock()
		w.batchLimit = max(1, len(batch)/2)
		w.mu.Unlock()
		return true
	}
	if err != nil && w.batchRefused(batch, err) {
		return true
	}
	w.mu.Lock()
	if err == nil {
		w.batchLimit = min(maxBatch, 2*max(w.batchLimit, 1))
	}
	if *last.ev.Seq >= w.singleThrough {
		w.singleThrough = 0
	}
	w.dropThrough(last)
	w.mu.Unlock()
	return true
}

// nextBatch marks as attempted, and returns, the events at the head of the
// queue up to a child, batchLimit events or maxBatchBytes, ending at an
// outcome; w.mu is held.
func (w *writer) nextBatch() ([]*pendingEvent, []etlcontext.NewEvent) {
	limit := cmp.Or(w.batchLimit, maxBatch)
	if w.singleThrough > 0 {
		limit = 1
	}
	var (
		batch []*pendingEvent
		evs   []etlcontext.NewEvent
		bytes int
	)
	for _, e := range w.events {
		if e.gone {
			continue
		}
		if e.child != nil || len(batch) == limit || (len(batch) > 0 && bytes+e.size > maxBatchBytes) {
			break
		}
		e.attempted = true
		if e.ev.Seq == nil {
			w.nextSeq++
			e.ev.Seq = new(w.nextSeq)
		}
		if e.replaced != nil {
			e.ev.Meta = e.replaced.meta()
		}
		batch = append(batch, e)
		evs = append(evs, e.ev)
		bytes += e.size
		if e.fallback != nil {
			// Nothing is written in the statement of an outcome after it.
			break
		}
	}
	return batch, evs
}

// batchRefused deals with a batch the database refused with err, and
// reports whether it is to be written again (one at a time, as its plain
// outcome, or as a WARNING standing in for it) rather than dropped.
func (w *writer) batchRefused(batch []*pendingEvent, err error) bool {
	e, typ := batch[0], batch[0].ev.Type
	if w.stale(err, typ) {
		return false
	}
	w.mu.Lock()
	var warn string
	switch {
	case len(batch) > 1:
		// One of them is refused: find which, one at a time.
		w.singleThrough = *batch[len(batch)-1].ev.Seq
	case e.fallback != nil:
		// The outcome must be recorded: the plainest one is.
		warn = "the database refused the outcome; recording it without its details"
		e.ev.Payload, e.fallback = e.fallback, nil
	case !e.outcome && !e.stoodIn:
		warn = "the database refused an event; a WARNING stands in for it"
		w.standIn(e, map[string]any{"problem": "the database refused this event: " + err.Error(),
			"type": e.ev.Type})
	default:
		if e.outcome {
			w.eventErr = fmt.Errorf("store %s: %w", typ, err)
		}
		w.mu.Unlock()
		w.logger.Error("the database refused an event for good", "type", typ, "error", err)
		return false
	}
	w.mu.Unlock()
	// Logged once w.mu is let go: a stalled stderr must not block the queue.
	if warn != "" {
		w.logger.Warn(warn, "type", typ, "error", err)
	}
	return true
}

// standIn makes e a WARNING, with meta saying why, under its number; w.mu is held.
func (w *writer) standIn(e *pendingEvent, meta map[string]any) {
	e.ev.Type = protocol.EventType(w.kind, protocol.EventWarning)
	e.ev.Payload, e.ev.Meta, e.ev.Error = nil, meta, false
	e.child, e.stoodIn = nil, true
}

// stale reports whether err says the run is no longer current, superseding it.
func (w *writer) stale(err error, typ string) bool {
	if !errors.Is(err, etlcontext.ErrStaleRun) && !errors.Is(err, etlcontext.ErrFinished) {
		return false
	}
	w.logger.Warn("the database refused an event: this run is no longer current", "type", typ, "error", err)
	w.supersede()
	return true
}

// dropStored drops from the queue's head the events an earlier write stored
// although its reply was lost, as conn shows: the run may be over by that
// very write, its outcome, which is then written, not lost.
func (w *writer) dropStored(ctx context.Context, conn dbConn) bool {
	w.mu.Lock()
	var last *pendingEvent
	for _, e := range w.events {
		if e.gone {
			continue
		}
		if !e.attempted || e.child != nil || e.ev.Seq == nil || e.ev.RunID == nil {
			break
		}
		last = e
	}
	w.mu.Unlock()
	if last == nil {
		return false
	}
	// A write is one statement, and takes the queue's head: its last
	// event stored, so is every event before it. (An attempted event no
	// longer changes but on the writer's goroutine.)
	stored, err := etlcontext.EventStored(ctx, conn, last.ev.ContextID, *last.ev.RunID, *last.ev.Seq)
	if err != nil {
		w.logger.Warn("look whether an earlier write of the events committed", "error", err)
	}
	if !stored {
		return false
	}
	if last.outcome && w.lastOfTail() != nil {
		// Written with the outcome, in its statement.
		w.tail.Load().sent()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropThrough(last)
	w.endedByOwnWrite = true
	return true
}

// dropThrough drops the events from the head of the queue through last,
// written (none when nil), and the replaced ones around them; w.mu is held.
// Only the writer's goroutine drops, so last is in the queue; should it not
// be, an event never sent (not attempted) still stops the drop, rather
// than being lost.
func (w *writer) dropThrough(last *pendingEvent) {
	for len(w.events) > 0 {
		e := w.events[0]
		switch {
		case e.gone:
			w.goneCount--
		case last == nil || !e.attempted:
			w.markIdle()
			return
		default:
			if w.latest[e.coalesce] == e {
				delete(w.latest, e.coalesce)
			}
			w.leave(e)
			w.written++
			if e == last {
				last = nil
			}
		}
		w.events = w.events[1:]
	}
	w.markIdle()
}

// serveChild submits the child of e with its SUBMITTED event.
func (w *writer) serveChild(ctx context.Context, e *pendingEvent) bool {
	var refused error
	err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			refused = nil
			if w.submit == nil {
				refused = errors.New("this task process cannot submit children")
				return refused
			}
			id, created, err := w.submit(ctx, tx, *e.child)
			if err != nil {
				refused = err
				return err
			}
			ev := e.ev
			ev.Payload = map[string]any{"child_id": id, "kind": e.child.Kind, "idempotency_key": e.child.IdempotencyKey, "created": created}
			_, err = etlcontext.Append(ctx, tx, ev)
			return err
		})
	})
	switch {
	case w.retry(ctx, err):
		return true
	case refused != nil && classifyWriteError(refused, w.conn) != statementError:
		w.sayBusy("submit child: the database refused it for now; it is tried again", refused)
		pause(ctx, time.Second)
		return true
	case refused == nil && w.stale(err, e.ev.Type):
	case err != nil:
		// The child is refused for good (an unknown kind, arguments that
		// lack the kind's concurrency key), or its SUBMITTED event is: the
		// child is not submitted (one transaction). A WARNING says so in
		// its place.
		if refused != nil {
			w.logger.Warn("submit child", "kind", e.child.Kind, "error", refused)
			err = refused
		} else {
			w.logger.Warn("store event", "type", e.ev.Type, "error", err)
		}
		w.mu.Lock()
		w.refusedChildren++
		w.standIn(e, map[string]any{"problem": "submit " + e.child.Kind + " child: " + err.Error()})
		e.stoodIn = refused == nil
		w.mu.Unlock()
		return true
	}
	w.mu.Lock()
	w.dropThrough(e)
	w.mu.Unlock()
	return true
}
