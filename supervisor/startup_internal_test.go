package supervisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
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
	s, err := New(pool, loadTestConfig(t, env), Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
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
	if !testenv.Holds(2*time.Second, func() bool { return len(ran) == 0 }) {
		t.Fatalf("the supervisor gave up on a full server: %v", <-ran)
	}
	release()
	select {
	case <-s.Started():
	case err := <-ran:
		t.Fatalf("the supervisor stopped instead of starting: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the supervisor did not start within a minute of the server taking connections again")
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
}
