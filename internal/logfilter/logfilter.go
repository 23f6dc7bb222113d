// Package logfilter holds the slog handlers that keep dama's logs quiet:
// a level floor for the libraries' chatter, and the muting of what an
// outage of the database makes everything fail with.
package logfilter

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Floor passes on Handler's records from Min up.
type Floor struct {
	slog.Handler
	Min slog.Level
}

// Enabled reports whether l is at least Min and Handler takes it.
func (f Floor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.Min && f.Handler.Enabled(ctx, l)
}

// WithAttrs returns the floor over Handler.WithAttrs.
func (f Floor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return Floor{Handler: f.Handler.WithAttrs(attrs), Min: f.Min}
}

// WithGroup returns the floor over Handler.WithGroup.
func (f Floor) WithGroup(name string) slog.Handler {
	return Floor{Handler: f.Handler.WithGroup(name), Min: f.Min}
}

// Outage mutes warnings and errors while the database is known to be
// unreachable: every statement fails then, and each failure would say so
// again (River's fetches alone, several a second). Whoever notices the
// outage logs it once and calls Begin, and at its end calls End and logs
// how many records were muted. The zero Outage is ready, and not muting.
type Outage struct {
	down  atomic.Bool
	muted atomic.Int64
	// begun counts the outages, for Delayed's records.
	begun atomic.Int64
}

// Begin starts muting.
func (o *Outage) Begin() {
	o.begun.Add(1)
	o.down.Store(true)
}

// End stops muting and returns how many records were muted since Begin.
func (o *Outage) End() int64 {
	o.down.Store(false)
	return o.muted.Swap(0)
}

// Handler returns h, muted during an outage.
func (o *Outage) Handler(h slog.Handler) slog.Handler { return muted{Handler: h, o: o} }

type muted struct {
	slog.Handler
	o *Outage
}

func (m muted) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && m.o.down.Load() {
		m.o.muted.Add(1)
		return nil
	}
	return m.Handler.Handle(ctx, r)
}

func (m muted) WithAttrs(attrs []slog.Attr) slog.Handler {
	return muted{Handler: m.Handler.WithAttrs(attrs), o: m.o}
}

func (m muted) WithGroup(name string) slog.Handler {
	return muted{Handler: m.Handler.WithGroup(name), o: m.o}
}

// Delayed returns h, muted during an outage, whose warnings and errors
// are held for d and then dropped if an outage began meanwhile: for those
// who notice an outage at the same instant as whoever calls Begin (River's
// fetches and notifier, a listening connection), which would otherwise
// say so first.
func (o *Outage) Delayed(h slog.Handler, d time.Duration) slog.Handler {
	return delayed{Handler: h, o: o, d: d}
}

type delayed struct {
	slog.Handler
	o *Outage
	d time.Duration
}

func (h delayed) Handle(ctx context.Context, r slog.Record) error {
	switch {
	case r.Level < slog.LevelWarn:
		return h.Handler.Handle(ctx, r)
	case h.o.down.Load():
		h.o.muted.Add(1)
		return nil
	}
	r, begun := r.Clone(), h.o.begun.Load()
	time.AfterFunc(h.d, func() {
		if h.o.begun.Load() != begun {
			h.o.muted.Add(1)
			return
		}
		_ = h.Handler.Handle(context.WithoutCancel(ctx), r)
	})
	return nil
}

func (h delayed) WithAttrs(attrs []slog.Attr) slog.Handler {
	return delayed{Handler: h.Handler.WithAttrs(attrs), o: h.o, d: h.d}
}

func (h delayed) WithGroup(name string) slog.Handler {
	return delayed{Handler: h.Handler.WithGroup(name), o: h.o, d: h.d}
}
