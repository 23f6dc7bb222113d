package pglisten_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/internal/testenv"
)

// TestListenerRidesOutATerminatedConnection: a notification is heard; the
// listening backend terminated by the server is replaced, and looked
// through again (Look) before the next notification; ErrStop ends Serve.
func TestListenerRidesOutATerminatedConnection(t *testing.T) {
	env := testenv.NewUnmigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var looks, reconnects atomic.Int32
	heard := make(chan string, 10)
	failed := make(chan error, 10)
	l := &pglisten.Listener[*pgx.Conn]{
		Connect: listening(env.URL, "pglisten-test", "pglisten_test"),
		Look: func(context.Context, *pgx.Conn) error {
			looks.Add(1)
			return nil
		},
		Notify: func(_ context.Context, n *pgconn.Notification) error {
			if n.Payload == "stop" {
				return pglisten.ErrStop
			}
			heard <- n.Payload
			return nil
		},
		RetryDelay:  10 * time.Millisecond,
		Failed:      func(err error) bool { failed <- err; return true },
		Reconnected: func() { reconnects.Add(1) },
	}
	if err := l.Open(ctx); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve(ctx) }()

	// notify repeats a notification until it is heard: one sent before
	// the (new) connection listens is not.
	notify := func(payload string) {
		t.Helper()
		for {
			if _, err := env.Pool.Exec(ctx, `SELECT pg_notify('pglisten_test', $1)`, payload); err != nil {
				t.Fatal(err)
			}
			select {
			case got := <-heard:
				if got == payload {
					return
				}
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("%q was never heard", payload)
			}
		}
	}
	notify("one")
	if n := looks.Load(); n != 1 {
		t.Fatalf("%d looks before the first notification, want 1", n)
	}
	var terminated int
	if err := env.Pool.QueryRow(ctx, `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		 WHERE application_name = 'pglisten-test'`).Scan(&terminated); err != nil || terminated != 1 {
		t.Fatalf("terminated %d listening backends (%v), want 1", terminated, err)
	}
	select {
	case err := <-failed:
		t.Logf("the listener failed as it should: %v", err)
	case <-ctx.Done():
		t.Fatal("the listener never noticed its backend was gone")
	}
	notify("two")
	if n, r := looks.Load(), reconnects.Load(); n != 2 || r != 1 {
		t.Fatalf("%d looks and %d reconnects, want 2 and 1", n, r)
	}
	if _, err := env.Pool.Exec(ctx, `SELECT pg_notify('pglisten_test', 'stop')`); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after ErrStop: %v", err)
	}
}

// TestListenerLooksAgainEveryRecheckAndStopsWhenTold: Look runs every
// Recheck, however many notifications arrive meanwhile, and a failure
// Failed refuses ends Serve with it.
func TestListenerLooksAgainEveryRecheckAndStopsWhenTold(t *testing.T) {
	env := testenv.NewUnmigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A notification every 10 ms, far more often than Recheck.
	flood, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	go func() {
		for flood.Err() == nil {
			_, _ = env.Pool.Exec(flood, `SELECT pg_notify('pglisten_flood', 'x')`)
			select {
			case <-flood.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	refused := errors.New("refused")
	var looks atomic.Int32
	l := &pglisten.Listener[*pgx.Conn]{
		Connect: listening(env.URL, "pglisten-flood", "pglisten_flood"),
		Look: func(context.Context, *pgx.Conn) error {
			if looks.Add(1) == 3 {
				return refused
			}
			return nil
		},
		Notify:  func(context.Context, *pgconn.Notification) error { return nil },
		Recheck: 200 * time.Millisecond,
		Failed:  func(err error) bool { return !errors.Is(err, refused) },
	}
	if err := l.Serve(ctx); !errors.Is(err, refused) {
		t.Fatalf("Serve = %v, want the refused look's error", err)
	}
	if n := looks.Load(); n != 3 {
		t.Fatalf("%d looks, want 3", n)
	}
}

// TestListenerBacksOffWhateverWakesIt: a server that refuses connections,
// or takes them and ends them at once, is tried again no faster than the
// backoff allows, however many wakes hurry the listener.
func TestListenerBacksOffWhateverWakesIt(t *testing.T) {
	env := testenv.NewUnmigrated(t)
	for _, tc := range []struct {
		name    string
		connect func(ctx context.Context) (*pgx.Conn, error)
	}{
		{"refused", func(context.Context) (*pgx.Conn, error) { return nil, errors.New("refused") }},
		{"ended at once", func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, env.URL) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A second, and two connections' time at this machine's
			// pace: two tries are sure to fit.
			began := time.Now()
			if conn, err := pgx.Connect(context.Background(), env.URL); err != nil {
				t.Fatal(err)
			} else {
				conn.Close(context.Background())
			}
			window := time.Second + 2*time.Since(began)
			ctx, cancel := context.WithTimeout(context.Background(), window)
			defer cancel()
			wake := make(chan struct{}, 1)
			go func() {
				for ctx.Err() == nil {
					select {
					case wake <- struct{}{}:
					case <-ctx.Done():
					}
				}
			}()
			var tries atomic.Int32
			l := &pglisten.Listener[*pgx.Conn]{
				Connect: func(ctx context.Context) (*pgx.Conn, error) {
					tries.Add(1)
					return tc.connect(ctx)
				},
				// A connection that fails as soon as it is open.
				Look:       func(context.Context, *pgx.Conn) error { return errors.New("ended") },
				Wake:       wake,
				RetryDelay: 400 * time.Millisecond,
			}
			if err := l.Serve(ctx); err != nil {
				t.Fatal(err)
			}
			// At once, then after at least 100, 200 and 400 ms, each wake
			// hurrying at most one of them to 100 ms after the try before.
			if n, most := tries.Load(), 1+int32(window/(100*time.Millisecond)); n < 2 || n > most {
				t.Errorf("%d tries to connect in %s, want 2 to %d", n, window.Round(time.Millisecond), most)
			}
		})
	}
}

// listening connects to url as application name, and listens on channel,
// as a Connect does.
func listening(url, name, channel string) func(context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = name
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := pglisten.Listen(ctx, conn, channel); err != nil {
			conn.Close(ctx)
			return nil, err
		}
		return conn, nil
	}
}
