package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// newListener is the supervisor's connection that hears runners announce
// their exit, and operators resume queues and unblock kinds. It holds no
// lock: the liveness lock has a connection of its own (newLiveness), so
// that the listener can fail and reconnect without anyone taking the
// supervisor for dead. What it hears is a hint: a woken job's step looks at
// the context itself, and the watch looks at every task each poll
// interval, so nothing heard while it reconnects is lost.
func (s *Supervisor) newListener() *pglisten.Listener {
	return &pglisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := s.connectNamed(ctx, listenAppNamePrefix+s.river.ID())
			if err != nil {
				return nil, fmt.Errorf("open listening connection: %w", err)
			}
			return conn, nil
		},
		Channels: []string{protocol.ExitedChannel, etlcontext.ControlChannel},
		Notify:   s.heard,
		Failed: func(err error) bool {
			s.logger.Warn("listening connection failed; reconnecting", "error", err)
			return true
		},
		Reconnected: func() { s.metrics.reconnects.WithLabelValues("listener").Inc() },
	}
}

// Bounds of what the listener hears, which anyone who can connect may
// send: a flood costs at most maxHeard pending contexts and hearWorkers
// goroutines. A hint dropped at the bound is made good by the watch, every
// poll interval.
const (
	maxHeard    = 10000
	hearWorkers = 4
)

// hearings holds what the listener heard and the workers have not acted
// on yet: the contexts whose task process announced its exit, and whether
// a queue was resumed or a kind unblocked. Repeats coalesce.
type hearings struct {
	mu      sync.Mutex
	exited  map[int64]struct{}
	control bool
	// ready has a token while anything is pending.
	ready chan struct{}
}

func newHearings() *hearings {
	return &hearings{exited: map[int64]struct{}{}, ready: make(chan struct{}, 1)}
}

func (h *hearings) signal() {
	select {
	case h.ready <- struct{}{}:
	default:
	}
}

// What became of a notification (dama_notifications_total).
const (
	heardQueued  = "queued"
	heardDropped = "dropped"
	heardIgnored = "ignored"
)

// heard notes a notification of the listener, for the workers (actOnHeard)
// to act on.
func (s *Supervisor) heard(_ context.Context, n *pgconn.Notification) error {
	outcome := s.note(n)
	s.metrics.heard.WithLabelValues(n.Channel, outcome).Inc()
	return nil
}

// note queues what notification n asks for and says what became of it.
func (s *Supervisor) note(n *pgconn.Notification) string {
	h := s.hearings
	if n.Channel == etlcontext.ControlChannel {
		var c etlcontext.Control
		if json.Unmarshal([]byte(n.Payload), &c) != nil {
			return heardIgnored
		}
		h.mu.Lock()
		h.control = true
		h.mu.Unlock()
		h.signal()
		return heardQueued
	}
	id, err := strconv.ParseInt(n.Payload, 10, 64)
	if err != nil {
		return heardIgnored
	}
	s.mu.Lock()
	_, mine := s.children[id]
	s.mu.Unlock()
	if mine {
		// Its reaping wakes it.
		return heardIgnored
	}
	h.mu.Lock()
	queued := len(h.exited) < maxHeard
	if queued {
		h.exited[id] = struct{}{}
	}
	h.mu.Unlock()
	h.signal()
	if !queued {
		return heardDropped
	}
	return heardQueued
}

// actOnHeard is one of the hearWorkers goroutines that act on what the
// listener heard, until ctx ends: they wake the job of each context whose
// exit was announced, and, for a resumed queue or an unblocked kind, the
// tasks waiting for a slot in every queue of the supervisor.
func (s *Supervisor) actOnHeard(ctx context.Context) {
	h := s.hearings
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.ready:
		}
		for ctx.Err() == nil {
			h.mu.Lock()
			var (
				id      int64
				found   bool
				control = h.control
			)
			h.control = false
			for id = range h.exited {
				delete(h.exited, id)
				found = true
				break
			}
			more := found && len(h.exited) > 0
			h.mu.Unlock()
			if more {
				// Another worker may take the rest meanwhile.
				h.signal()
			}
			if control {
				for _, q := range s.cfg.QueueNames() {
					s.wakeWaiting(ctx, q)
				}
			}
			if !found {
				break
			}
			s.wake(ctx, id)
		}
	}
}
