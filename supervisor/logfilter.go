package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// levelFloor passes on Handler's records from Min up.
type levelFloor struct {
	slog.Handler
	Min slog.Level
}

func (f levelFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.Min && f.Handler.Enabled(ctx, l)
}

func (f levelFloor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelFloor{Handler: f.Handler.WithAttrs(attrs), Min: f.Min}
}

func (f levelFloor) WithGroup(name string) slog.Handler {
	return levelFloor{Handler: f.Handler.WithGroup(name), Min: f.Min}
}

// outageMuter mutes warnings and errors while the database is known to be
// unreachable: every statement fails then (River's fetches alone, several a
// second). Whoever notices the outage logs it once and calls Begin, and at
// its end End. The zero outageMuter is ready, and not muting.
type outageMuter struct {
	down  atomic.Bool
	muted atomic.Int64
	// ended is when the last outage ended (End), in Unix nanoseconds.
	ended atomic.Int64
	// begun counts the outages, for the held records.
	begun atomic.Int64
	// held waits for the held records; once flushed, none is held, so
	// that held.Add never meets held.Wait.
	mu      sync.Mutex
	flushed bool
	held    sync.WaitGroup
}

// Begin starts muting. down is set before begun moves on, and a record
// reads begun before down (Handle): a record that read the new begun sees
// down, and one that read the old begun and no outage is dropped when its
// grace ends, so that none logged as the outage begins gets through.
func (o *outageMuter) Begin() {
	o.down.Store(true)
	o.begun.Add(1)
}

// End stops muting and returns how many records were muted since Begin.
func (o *outageMuter) End() int64 {
	o.ended.Store(time.Now().UnixNano())
	o.down.Store(false)
	return o.muted.Swap(0)
}

// Flush waits for the records held (see Handler) to be written or
// dropped, at most their grace, and holds none from then on, for good: a
// program calls it once, before it exits, lest its last warnings be lost.
func (o *outageMuter) Flush() {
	o.mu.Lock()
	o.flushed = true
	o.mu.Unlock()
	o.held.Wait()
}

// Handler returns h, muted during an outage. The warnings and errors for
// which held reports true (nil: all of them) are held for grace first, and
// dropped if an outage began meanwhile: those that whoever calls Begin may
// notice at the same instant would otherwise say so first.
func (o *outageMuter) Handler(h slog.Handler, grace time.Duration, held func(slog.Record) bool) slog.Handler {
	return muted{Handler: h, o: o, grace: grace, held: held}
}

type muted struct {
	slog.Handler
	o     *outageMuter
	grace time.Duration
	held  func(slog.Record) bool
}

func (m muted) Handle(ctx context.Context, r slog.Record) error {
	begun := m.o.begun.Load()
	switch {
	case r.Level < slog.LevelWarn:
		return m.Handler.Handle(ctx, r)
	case m.o.down.Load():
		m.o.muted.Add(1)
		return nil
	case m.grace <= 0 || (m.held != nil && !m.held(r)):
		return m.Handler.Handle(ctx, r)
	}
	m.o.mu.Lock()
	flushed := m.o.flushed
	if !flushed {
		m.o.held.Add(1)
	}
	m.o.mu.Unlock()
	if flushed {
		return m.Handler.Handle(ctx, r)
	}
	r = r.Clone()
	time.AfterFunc(m.grace, func() {
		defer m.o.held.Done()
		if m.o.begun.Load() != begun {
			m.o.muted.Add(1)
			return
		}
		_ = m.Handler.Handle(context.WithoutCancel(ctx), r)
	})
	return nil
}

func (m muted) WithAttrs(attrs []slog.Attr) slog.Handler {
	m.Handler = m.Handler.WithAttrs(attrs)
	return m
}

func (m muted) WithGroup(name string) slog.Handler {
	m.Handler = m.Handler.WithGroup(name)
	return m
}

// outageTail is how long after an outage River may still say what failed
// in it: its completer tries a batch three times, 1 s and 2 s apart, each
// try for up to 10 s, and says it gave up, with the last try's error, 4 s
// after the last one failed.
const outageTail = 15 * time.Second

// riverTail drops River's records of an outage that come within tail of
// its end, which the outage's two lines said: a failure for an error that
// says the database was unreachable, and its completer's tries ("Completer
// error (will retry after sleep)", "Too many errors; giving up"), whose
// outcome it says next ("Error completing batch", with the error; the batch
// is tried again at its next tick). Any other failure passes.
type riverTail struct {
	slog.Handler
	o    *outageMuter
	tail time.Duration
}

func (h riverTail) Handle(ctx context.Context, r slog.Record) error {
	ended := h.o.ended.Load()
	if ended != 0 && time.Since(time.Unix(0, ended)) < h.tail &&
		(lostTheDatabase(r) || strings.HasSuffix(r.Message, ": Too many errors; giving up") || strings.HasSuffix(r.Message, ": Completer error (will retry after sleep)")) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h riverTail) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(attrs)
	return h
}

func (h riverTail) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}
