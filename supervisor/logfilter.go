package supervisor

import (
	"context"
	"log/slog"
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
