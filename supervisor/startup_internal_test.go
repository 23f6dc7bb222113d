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

	"github.com/dama-etl/dama/etlcontext"
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
			if !etlcontext.Unreachable(err) {
				t.Fatal(err)
			}
			break
		}
		held = append(held, c)
	}
	started := startWaiting(t, env, pool, env.URL, "the server full")
	release()
	started("the server took connections again")
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
	started := startWaiting(t, env, pool, u.String(), "the standby read-only")
	primary.Stop(t, "immediate")
	standby.Promote(t)
	started("the promotion")
}

// startWaiting runs a supervisor of env's configuration on pool and
// dbURL until the test ends, and waits until it finds the database in
// the state what describes (it logs that it waits for it), however long
// a slow machine takes to get there, and then for 2 s (two of its retries), in
// which it must not give up. started, called once the database is back,
// waits for the supervisor's start (logging how long after the event
// named by after it came) and stops it.
func startWaiting(t *testing.T, env *testenv.Env, pool *pgxpool.Pool, dbURL, what string) (started func(after string)) {
	t.Helper()
	waiting := &waitHeard{heard: make(chan struct{})}
	s, err := New(pool, loadTestConfig(t, env), Options{
		DatabaseURL: dbURL,
		Executable:  env.DamaBin,
		Logger:      slog.New(waiting),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
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
	await := func(msg string, c <-chan struct{}) {
		t.Helper()
		testenv.Eventually(t, time.Minute, msg, func() (bool, error) {
			select {
			case <-c:
				return true, nil
			case err := <-ran:
				t.Fatalf("the supervisor stopped, waiting for %s: %v", msg, err)
			default:
			}
			return false, nil
		})
	}
	await("the supervisor to find "+what, waiting.heard)
	if !testenv.Holds(2*time.Second, func() bool { return len(ran) == 0 }) {
		t.Fatalf("the supervisor gave up on %s: %v", what, <-ran)
	}
	return func(after string) {
		t.Helper()
		since := time.Now()
		await("the supervisor to start once "+after, s.Started())
		t.Logf("started %s after %s", time.Since(since).Round(time.Millisecond), after)
		stop()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v", err)
		}
	}
}

// waitHeard is a log handler that discards every record, and closes heard
// at the first that says the database is unreachable and waited for
// (etlcontext.WaitReachable).
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
