package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/protocol"
)

// newListener is the supervisor's connection that hears runners announce
// their exit, and operators resume queues and unblock kinds. It holds no
// lock, so that it can fail and reconnect without anyone taking the
// supervisor for dead. What it hears is a hint: the watch looks at every
// task each poll interval, so nothing missed while it reconnects is lost.
func (s *Supervisor) newListener() *pglisten.Listener[*pgx.Conn] {
	return &pglisten.Listener[*pgx.Conn]{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := s.connectNamed(ctx, listenAppNamePrefix+s.river.ID())
			if err != nil {
				return nil, fmt.Errorf("open listening connection: %w", err)
			}
			if err := pglisten.Listen(ctx, conn, protocol.ExitedChannel, etlcontext.ControlChannel); err != nil {
				conn.Close(ctx)
				return nil, err
			}
			return conn, nil
		},
		Notify: s.heard,
		Failed: func(err error) bool {
			// Muted if the database is gone: the liveness connection
			// reports that.
			slog.New(s.outage.Handler(s.opts.Logger.Handler(), outageGrace, nil)).Warn("listening connection failed; reconnecting", "error", err)
			return true
		},
		Reconnected: func() { s.metrics.reconnects.WithLabelValues("listener").Inc() },
	}
}

// What became of a notification (dama_notifications_total).
const (
	heardQueued  = "queued"
	heardIgnored = "ignored"
)

// heard counts a notification of the listener as note handles it.
func (s *Supervisor) heard(_ context.Context, n *pgconn.Notification) error {
	s.metrics.heard.WithLabelValues(n.Channel, s.note(n)).Inc()
	return nil
}

// note acts on notification n, which anyone who can connect may send, so
// that a flood costs a map lookup each, and says what became of it: an
// announced exit pokes the Work holding that context's job here, if one
// does; a resumed queue or an unblocked kind is passed to controlLoop.
func (s *Supervisor) note(n *pgconn.Notification) string {
	if n.Channel == etlcontext.ControlChannel {
		var c etlcontext.Control
		if json.Unmarshal([]byte(n.Payload), &c) != nil {
			return heardIgnored
		}
		select {
		case s.controls <- struct{}{}:
		default:
		}
		return heardQueued
	}
	id, err := strconv.ParseInt(n.Payload, 10, 64)
	if err != nil {
		return heardIgnored
	}
	s.mu.Lock()
	_, mine := s.children[id]
	s.mu.Unlock()
	if mine || !s.poke(id) {
		// Its reaping pokes it, or no Work holds it here.
		return heardIgnored
	}
	return heardQueued
}

// controlGap is the least time between two wake-ups of every queue that
// announced controls, which anyone who can connect may send, ask for.
const controlGap = 100 * time.Millisecond

// controlLoop wakes the tasks waiting for a slot in every queue once a
// queue was resumed or a kind unblocked, until ctx ends.
func (s *Supervisor) controlLoop(ctx context.Context) {
	var woke time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.controls:
		}
		if wait := time.Until(woke.Add(controlGap)); wait > 0 && !sleep(ctx, wait) {
			return
		}
		for _, q := range s.cfg.QueueNames() {
			s.wakeWaiting(ctx, q)
		}
		woke = time.Now()
	}
}
