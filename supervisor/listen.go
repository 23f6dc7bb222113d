package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// newListener is the supervisor's connection that hears runners announce
// their exit, and operators resume queues and unblock kinds. It holds no
// lock: the liveness lock has a connection of its own (holdLiveness), so
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

// heard acts on a notification of the listener.
func (s *Supervisor) heard(ctx context.Context, n *pgconn.Notification) error {
	if n.Channel == etlcontext.ControlChannel {
		var c etlcontext.Control
		if json.Unmarshal([]byte(n.Payload), &c) == nil {
			go s.controlled(ctx, c)
		}
		return nil
	}
	id, err := strconv.ParseInt(n.Payload, 10, 64)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	_, mine := s.children[id]
	s.mu.Unlock()
	if !mine {
		go s.wake(ctx, id)
	}
	return nil
}

// controlled starts the tasks a resumed queue or an unblocked kind held
// back.
func (s *Supervisor) controlled(ctx context.Context, c etlcontext.Control) {
	for _, q := range s.cfg.QueueNames() {
		if c.Queue == q || c.Kind != "" {
			s.wakeWaiting(ctx, q)
		}
	}
}
