package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// listener is the supervisor's connection that hears runners announce their
// exit. It holds no lock: the liveness lock has a connection of its own
// (holdLiveness), so that the listener can fail and reconnect without anyone
// taking the supervisor for dead.
type listener struct {
	conn *pgx.Conn
}

func (s *Supervisor) connectListener(ctx context.Context) (*listener, error) {
	conn, err := s.connectNamed(ctx, listenAppNamePrefix+s.river.ID())
	if err != nil {
		return nil, fmt.Errorf("open listening connection: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+protocol.ExitedChannel+"; LISTEN "+etlcontext.ControlChannel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen for task exits: %w", err)
	}
	return &listener{conn: conn}, nil
}

// listen serves l until ctx ends, reconnecting when the connection fails.
func (s *Supervisor) listen(ctx context.Context, l *listener) {
	for {
		err := s.serveListener(ctx, l)
		l.conn.Close(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return
		}
		s.logger.Warn("listening connection failed; reconnecting", "error", err)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if l, err = s.connectListener(ctx); err == nil {
				s.metrics.reconnects.WithLabelValues("listener").Inc()
				break
			}
			s.logger.Warn("reconnect listening connection", "error", err)
		}
	}
}

func (s *Supervisor) serveListener(ctx context.Context, l *listener) error {
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == etlcontext.ControlChannel {
			var c etlcontext.Control
			if json.Unmarshal([]byte(n.Payload), &c) == nil {
				go s.controlled(ctx, c)
			}
			continue
		}
		id, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			continue
		}
		s.mu.Lock()
		_, mine := s.children[id]
		s.mu.Unlock()
		if !mine {
			go s.wake(ctx, id)
		}
	}
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
