package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// serveEvents writes the events at the head of the queue: a child alone,
// in its transaction, or else up to batchLimit events (and maxBatchBytes)
// in one statement, ending at an outcome.
func (w *writer) serveEvents(ctx context.Context) bool {
	w.mu.Lock()
	for len(w.events) > 0 && w.events[0].gone {
		w.events = w.events[1:]
		w.goneCount--
	}
	if len(w.events) == 0 {
		w.markIdle()
		w.mu.Unlock()
		return true
	}
	if e := w.events[0]; e.child != nil {
		e.writing, e.attempted = true, true
		w.mu.Unlock()
		return w.serveChild(ctx, e)
	}
	batch, evs := w.nextBatch()
	w.mu.Unlock()

	err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.AppendEvents(ctx, conn, evs)
	})
	if w.retry(ctx, err) {
		w.mu.Lock()
		for _, e := range batch {
			e.writing = false
		}
		// A batch cut short (a timeout, a server short of memory) is
		// smaller next time.
		w.batchLimit = max(1, len(batch)/2)
		w.mu.Unlock()
		return true
	}
	if err != nil && w.batchRefused(batch, err) {
		return true
	}
	last := *batch[len(batch)-1].ev.Seq
	w.mu.Lock()
	if err == nil {
		w.batchLimit = min(maxBatch, 2*max(w.batchLimit, 1))
	}
	if last >= w.singleThrough {
		w.singleThrough = 0
	}
	// The batch, and the replaced events among it, leave from the head.
	for len(w.events) > 0 && (w.events[0].writing || w.events[0].gone) {
		e := w.events[0]
		if e.gone {
			w.goneCount--
		}
		w.forget(e)
		w.events = w.events[1:]
	}
	w.markIdle()
	w.mu.Unlock()
	return true
}

// nextBatch marks for writing, and returns, the events at the head of the
// queue up to a child, batchLimit events or maxBatchBytes, ending at an
// outcome; w.mu is held.
func (w *writer) nextBatch() ([]*pendingEvent, []etlcontext.NewEvent) {
	limit := w.batchLimit
	if limit == 0 {
		limit = maxBatch
	}
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
		e.writing, e.attempted = true, true
		if e.ev.Seq == nil {
			w.number(e)
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
	typ := batch[0].ev.Type
	if errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished) {
		w.logger.Warn("the database refused an event: this run is no longer current", "type", typ, "error", err)
		w.supersede()
		return false
	}
	// Logged once w.mu is let go: a stalled stderr must not block the
	// queue.
	var say func()
	defer func() { say() }()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch e := batch[0]; {
	case len(batch) > 1:
		// One of them is refused: find which, one at a time, up to the
		// batch's last.
		say = func() {}
		w.singleThrough = *batch[len(batch)-1].ev.Seq
	case e.fallback != nil:
		// The outcome must be recorded: the plainest one is.
		say = func() {
			w.logger.Warn("the database refused the outcome; recording it without its details", "type", typ, "error", err)
		}
		e.ev.Payload, e.fallback = e.fallback, nil
	case !e.outcome && !e.stoodIn:
		// A WARNING saying so takes its place, under its sequence number.
		say = func() {
			w.logger.Warn("the database refused an event; a WARNING stands in for it", "type", typ, "error", err)
		}
		e.ev.Meta = map[string]any{"problem": "the database refused this event: " + err.Error(), "type": e.ev.Type}
		e.ev.Type, e.ev.Payload, e.ev.Error = protocol.EventType(w.kind, protocol.EventWarning), nil, false
		e.stoodIn = true
	default:
		say = func() { w.logger.Error("the database refused an event for good", "type", typ, "error", err) }
		if e.outcome {
			w.eventErr = fmt.Errorf("store %s: %w", typ, err)
		}
		return false
	}
	for _, e := range batch {
		e.writing = false
	}
	return true
}

// dropStored drops from the head of the queue the events an earlier write
// stored although its reply was lost (its connection was cut as it
// committed), as conn shows: the run may be over by that very write, its
// outcome, which is then written, not lost.
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
	var ev etlcontext.NewEvent
	if last != nil {
		ev = last.ev
	}
	w.mu.Unlock()
	if last == nil {
		return false
	}
	// A write is one statement, and takes the queue's head: its last
	// event stored, so is every event before it.
	stored, err := etlcontext.EventStored(ctx, conn, ev.ContextID, *ev.RunID, *ev.Seq)
	if err != nil {
		w.logger.Warn("look whether an earlier write of the events committed", "error", err)
	}
	if !stored {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.events) > 0 {
		e := w.events[0]
		if e.gone {
			w.goneCount--
		} else if e.order > last.order {
			break
		}
		w.forget(e)
		w.events = w.events[1:]
	}
	w.endedByOwnWrite = true
	w.markIdle()
	return true
}

// forget drops e, written or refused, from the bookkeeping; w.mu is held.
func (w *writer) forget(e *pendingEvent) {
	if e.coalesce != "" && w.latest[e.coalesce] == e {
		delete(w.latest, e.coalesce)
	}
	if !e.gone {
		w.leave(e)
	}
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
	again := w.retry(ctx, err)
	switch {
	case again:
		return true
	case refused != nil && classifyWriteError(refused, w.conn) != statementError:
		w.sayBusy("submit child: the database refused it for now; it is tried again", refused)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return true
	case refused != nil:
		// The child is refused for good (an unknown kind, arguments that
		// lack the kind's concurrency key): the line is recorded as a
		// WARNING in its place, under the same sequence number.
		w.logger.Warn("submit child", "kind", e.child.Kind, "error", refused)
		w.mu.Lock()
		w.refusedChildren++
		e.ev.Type = protocol.EventType(w.kind, protocol.EventWarning)
		e.ev.Meta = map[string]any{"problem": "submit " + e.child.Kind + " child: " + refused.Error()}
		e.child = nil
		e.writing = false
		w.mu.Unlock()
		return true
	case errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished):
		w.logger.Warn("the database refused an event: this run is no longer current", "type", e.ev.Type, "error", err)
		w.supersede()
	case err != nil:
		// Its SUBMITTED event, not the child, was refused: the child is
		// not submitted (one transaction), and a WARNING says so.
		w.logger.Warn("store event", "type", e.ev.Type, "error", err)
		w.mu.Lock()
		w.refusedChildren++
		e.ev.Type = protocol.EventType(w.kind, protocol.EventWarning)
		e.ev.Meta = map[string]any{"problem": "submit " + e.child.Kind + " child: " + err.Error()}
		e.child, e.stoodIn, e.writing = nil, true, false
		w.mu.Unlock()
		return true
	}
	w.mu.Lock()
	w.events = w.events[1:]
	w.forget(e)
	w.markIdle()
	w.mu.Unlock()
	return true
}
