package taskrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// event queues an event of the runner's own; it never blocks, and it is
// never dropped.
func (w *writer) event(suffix string, payload, meta any, isError bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.releaseCheckpoint()
	w.append(w.newEvent(suffix, payload, meta, isError))
}

// outcome queues the event that records the attempt's outcome, with the
// payload to store instead should the database refuse this one.
func (w *writer) outcome(suffix string, payload, fallback protocol.Outcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// The newest checkpoint is stored before the outcome.
	w.releaseAll()
	e := w.newEvent(suffix, payload, nil, false)
	e.fallback, e.outcome = fallback, true
	w.append(e)
}

// report queues an event the command reported. It waits while the bounds
// are reached, until ctx ends or the run is superseded, unless the event
// coalesces: then it is sampled (writesample.go), and at the bounds it
// replaces the waiting one of its suffix. replaced is what was replaced in
// the line, so that the database takes it.
func (w *writer) report(ctx context.Context, suffix string, payload json.RawMessage, meta any, isError bool, replaced etlcontext.Replaced) error {
	e := w.newEvent(suffix, payload, meta, false)
	e.ev.Error = isError
	e.piped = true
	if coalescing[suffix] {
		e.coalesce = suffix
		w.mu.Lock()
	} else if err := w.waitRoom(ctx, e.size); err != nil {
		return err
	}
	defer w.mu.Unlock()
	if replaced.Any() {
		w.noteReplaced(suffix, replaced)
	}
	if e.coalesce != "" && w.hold(e) {
		return nil
	}
	if e.coalesce == "" {
		w.releaseCheckpoint()
	}
	w.append(e)
	return nil
}

// waitRoom returns, with w.mu held, once an event of size fits within the
// bounds; an event alone in the queue always fits.
func (w *writer) waitRoom(ctx context.Context, size int) error {
	for {
		w.mu.Lock()
		if !w.full(size) {
			return nil
		}
		room := w.room
		w.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		case <-w.superseded:
			return etlcontext.ErrStaleRun
		}
	}
}

// compact drops the replaced events from the queue once they are half of
// it: a command that reports progress while the head waits (the database
// away) must not grow it; w.mu is held.
func (w *writer) compact() {
	if w.goneCount < 64 || w.goneCount < len(w.events)/2 {
		return
	}
	kept := w.events[:0]
	for _, e := range w.events {
		if !e.gone {
			kept = append(kept, e)
		}
	}
	clear(w.events[len(kept):])
	w.events = kept
	w.goneCount = 0
}

// full reports whether an event of size from the pipe would pass the
// bounds; w.mu is held. An event alone in the queue always fits.
func (w *writer) full(size int) bool {
	return w.piped > 0 && (w.piped >= maxPendingEvents || w.pipedBytes+size > maxPendingBytes)
}

// newEvent makes the next event of the run, its payload and meta cleaned
// for the database; w.mu is held or the event is not queued yet.
func (w *writer) newEvent(suffix string, payload, meta any, isError bool) *pendingEvent {
	e := &pendingEvent{ev: etlcontext.NewEvent{ContextID: w.contextID, Type: protocol.EventType(w.kind, suffix), Error: isError}}
	var replaced etlcontext.Replaced
	e.ev.Payload, replaced = cleanValue(payload)
	m, r := cleanValue(meta)
	e.ev.Meta, replaced = m, replaced.Add(r)
	e.size = 256 + len(asRaw(e.ev.Payload)) + len(asRaw(e.ev.Meta))
	if replaced.Any() {
		// Rare, and only of the runner's own text: noted beside the event.
		e.replaced = &replacedNote{lines: 1, replaced: replaced, types: []string{suffix}}
	}
	return e
}

// append numbers e and queues it; w.mu is held.
func (w *writer) append(e *pendingEvent) {
	if e.replaced != nil && e.coalesce != replacedKey {
		// Noted ahead of e: nothing may follow an outcome.
		note := e.replaced
		e.replaced = nil
		w.mergeReplaced(note)
	}
	runID := w.runID
	e.ev.RunID = &runID
	if e.child != nil {
		// Its key names its line now; other events are numbered when first
		// written, so that those a newer one replaced use up no number.
		w.number(e)
	}
	w.appended++
	e.order = w.appended
	if e.coalesce == "" {
		w.plainOrder = e.order
	}
	if e.coalesce != "" {
		// Only at the bounds: until then every report is kept. A
		// checkpoint followed by a named event or a child stays: the newer
		// one, after them, may not stand in for it.
		if old := w.latest[e.coalesce]; old != nil && !old.attempted && !old.gone && (e.coalesce == replacedKey || w.full(e.size)) &&
			(e.coalesce != protocol.EventCheckpoint || old.order > w.plainOrder) {
			old.gone = true
			old.ev.Payload, old.ev.Meta, old.replaced = nil, nil, nil
			w.leave(old)
			w.goneCount++
			w.compact()
		}
		w.latest[e.coalesce] = e
	}
	if e.piped {
		w.piped++
		w.pipedBytes += e.size
	}
	w.events = append(w.events, e)
	w.signal()
}

// number gives e the run's next sequence number; w.mu is held.
func (w *writer) number(e *pendingEvent) {
	w.nextSeq++
	seq := w.nextSeq
	e.ev.Seq = &seq
}

// noteReplaced records that a reported line of type suffix needed
// replacing; w.mu is held. One WARNING stands for every replacement until
// it is written.
func (w *writer) noteReplaced(suffix string, r etlcontext.Replaced) {
	w.mergeReplaced(&replacedNote{lines: 1, replaced: r, types: []string{suffix}})
}

// replacedIn is noteReplaced for what is not itself queued: a failure
// line, a child, the runner's own text.
func (w *writer) replacedIn(what string, r etlcontext.Replaced) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.noteReplaced(what, r)
}

func (w *writer) mergeReplaced(n *replacedNote) {
	if old := w.latest[replacedKey]; old != nil && !old.attempted && !old.gone {
		old.replaced.lines += n.lines
		old.replaced.replaced = old.replaced.replaced.Add(n.replaced)
		for _, t := range n.types {
			if !slices.Contains(old.replaced.types, t) {
				old.replaced.types = append(old.replaced.types, t)
			}
		}
		return
	}
	e := &pendingEvent{ev: etlcontext.NewEvent{ContextID: w.contextID, Type: protocol.EventType(w.kind, protocol.EventWarning)}, size: 512, coalesce: replacedKey, replaced: n}
	w.append(e)
}

// leave accounts for e leaving the queue (written or replaced); w.mu is
// held.
func (w *writer) leave(e *pendingEvent) {
	if !e.piped {
		return
	}
	e.piped = false
	w.piped--
	w.pipedBytes -= e.size
	close(w.room)
	w.room = make(chan struct{})
}

// cleanValue encodes v for the database, replacing what it would refuse.
func cleanValue(v any) (json.RawMessage, etlcontext.Replaced) {
	var raw []byte
	switch v := v.(type) {
	case nil:
		return nil, etlcontext.Replaced{}
	case json.RawMessage:
		raw = v
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			// The runner's own values always encode; say so rather than lose
			// the event.
			raw, _ = json.Marshal(map[string]string{"unencodable": err.Error()})
		}
	}
	if len(raw) == 0 {
		return nil, etlcontext.Replaced{}
	}
	clean, r, err := etlcontext.CleanJSON(raw)
	if err != nil {
		text, _ := etlcontext.CleanText(string(raw))
		clean, _ = json.Marshal(map[string]string{"not_json": text})
		r.InvalidUTF8++
	}
	return clean, r
}

func asRaw(v any) json.RawMessage {
	raw, _ := v.(json.RawMessage)
	return raw
}

// submitChild queues the submission of c, stored in order with the events
// as a SUBMITTED event of the run in the same transaction: the database's
// fence on the event refuses the child of a run that is no longer current.
// It waits for room as report does: a child is work, never dropped.
func (w *writer) submitChild(ctx context.Context, c protocol.Child) error {
	size := 256 + len(c.Args) + len(c.Kind) + len(c.IdempotencyKey)
	if err := w.waitRoom(ctx, size); err != nil {
		return err
	}
	defer w.mu.Unlock()
	w.releaseCheckpoint()
	c.ParentID = w.contextID
	e := &pendingEvent{ev: etlcontext.NewEvent{ContextID: w.contextID, Type: protocol.EventType(w.kind, protocol.EventSubmitted)}, size: size, child: &c, piped: true}
	w.append(e)
	// The key needs the sequence number append gave.
	if c.IdempotencyKey == "" {
		c.IdempotencyKey = fmt.Sprintf("dama:child:%d:%s%s:%d", w.contextID, protocol.AutoKeyPrefix, w.runID, *e.ev.Seq)
	} else {
		c.IdempotencyKey = fmt.Sprintf("dama:child:%d:%s", w.contextID, c.IdempotencyKey)
	}
	return nil
}

// refused returns how many children were refused for good.
func (w *writer) refused() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refusedChildren
}
