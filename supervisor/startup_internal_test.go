package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/internal/pgerr"
	"github.com/dama-etl/dama/internal/testenv"
)

// A supervisor that starts while the server takes no new connection
// (full, here; restarting or failing over, in a chaos run on a slow
// machine) waits for it, though its pool's connections work: it opens its
// liveness and listening connections once the server takes them, and
// starts.
func TestASupervisorStartingWhileTheServerIsFullWaitsForIt(t *testing.T) {
	srv := testenv.NewServerWith(t, "max_connections = 20\nsuperuser_reserved_connections = 0")
	env := testenv.NewOn(t, srv)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The pool's connections are made before the server is full.
	var conns []*pgxpool.Conn
	for range int(pool.Config().MaxConns) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	// Every other connection the server takes.
	var held []*pgx.Conn
	release := func() {
		for _, c := range held {
			c.Close(ctx)
		}
		held = nil
	}
	t.Cleanup(release)
	for {
		c, err := pgx.Connect(ctx, env.URL)
		if err != nil {
			if !pgerr.Unreachable(err) {
				t.Fatal(err)
			}
			break
		}
		held = append(held, c)
	}
	waiting := &waitHeard{heard: make(chan struct{})}
	s, err := New(pool, loadTestConfig(t, env), Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(waiting),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		ran <- s.Run(runCtx)
	}()
	// Before the pool and the server go, whatever the outcome.
	t.Cleanup(func() {
		stop()
		<-done
	})
	// The server is full when the supervisor first finds it so, however
	// long a slow machine takes to get there; then two of its retries.
	testenv.Eventually(t, time.Minute, "the supervisor to find the server full", func() (bool, error) {
		select {
		case <-waiting.heard:
			return true, nil
		case err := <-ran:
			t.Fatalf("the supervisor gave up on a full server: %v", err)
		default:
		}
		return false, nil
	})
	if !testenv.Holds(2*time.Second, func() bool { return len(ran) == 0 }) {
		t.Fatalf("the supervisor gave up on a full server: %v", <-ran)
	}
	release()
	released := time.Now()
	testenv.Eventually(t, time.Minute, "the supervisor to start once the server takes connections again", func() (bool, error) {
		select {
		case <-s.Started():
			return true, nil
		case err := <-ran:
			t.Fatalf("the supervisor stopped instead of starting: %v", err)
		default:
		}
		return false, nil
	})
	t.Logf("started %s after the server took connections again", time.Since(released).Round(time.Millisecond))
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
}

// A supervisor that starts on a standby (one that a switchover's DNS or
// proxy names before its promotion: reads work, LISTEN and writes fail
// with 25006) waits for its promotion, and starts.
func TestASupervisorStartingOnAStandbyWaitsForItsPromotion(t *testing.T) {
	primary := testenv.NewServer(t)
	env := testenv.NewOn(t, primary)
	standby := testenv.NewReplica(t, primary)
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", standby.Port())
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	waiting := &waitHeard{heard: make(chan struct{})}
	s, err := New(pool, loadTestConfig(t, env), Options{
		DatabaseURL: u.String(),
		Executable:  env.DamaBin,
		Logger:      slog.New(waiting),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		ran <- s.Run(runCtx)
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
	testenv.Eventually(t, time.Minute, "the supervisor to find the standby read-only", func() (bool, error) {
		select {
		case <-waiting.heard:
			return true, nil
		case err := <-ran:
			t.Fatalf("the supervisor gave up on a standby: %v", err)
		default:
		}
		return false, nil
	})
	if !testenv.Holds(2*time.Second, func() bool { return len(ran) == 0 }) {
		t.Fatalf("the supervisor gave up on a standby: %v", <-ran)
	}
	primary.Stop(t, "immediate")
	standby.Promote(t)
	promoted := time.Now()
	testenv.Eventually(t, time.Minute, "the supervisor to start once the standby is promoted", func() (bool, error) {
		select {
		case <-s.Started():
			return true, nil
		case err := <-ran:
			t.Fatalf("the supervisor stopped instead of starting: %v", err)
		default:
		}
		return false, nil
	})
	t.Logf("started %s after the promotion", time.Since(promoted).Round(time.Millisecond))
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
}

// waitHeard is a log handler that discards every record, and closes heard
// at the first that says the database is unreachable and waited for
// (pgerr.WaitReachable).
type waitHeard struct {
	once  sync.Once
	heard chan struct{}
}

func (h *waitHeard) Enabled(context.Context, slog.Level) bool { return true }
func (h *waitHeard) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *waitHeard) WithGroup(string) slog.Handler            { return h }

func (h *waitHeard) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "database unreachable; waiting for it" {
		h.once.Do(func() { close(h.heard) })
	}
	return nil
}
