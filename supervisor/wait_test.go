package supervisor_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// queryCounter counts the statements containing sql that go through the
// connections it traces.
type queryCounter struct {
	sql string
	n   atomic.Int64
}

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, c.sql) {
		c.n.Add(1)
	}
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingPool returns a pool of env's database that counts its statements
// containing sql.
func countingPool(t *testing.T, env *testenv.Env, sql string) (*pgxpool.Pool, *queryCounter) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := &queryCounter{sql: sql}
	pcfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, c
}

// Anyone who can connect may announce a context's end: 20,000 false
// announcements cost Client.Wait a read of the context per 100 ms at
// most, not one each, and the true one still ends the wait.
func TestAFloodOfFalseEndsCostsWaitFewReads(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// No deadline: the waits below bound the test, stretched on a slow
	// machine (testenv.Eventually).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  quick:
    command: ["/bin/true"]
`))
	if err != nil {
		t.Fatal(err)
	}
	// Context id's reads (etlcontext.Get).
	pool, looks := countingPool(t, env, "WHERE c.etl_context_id = $1")
	client, err := supervisor.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// No supervisor runs: the task waits until it is cancelled.
	id, _, err := client.Submit(ctx, supervisor.SubmitParams{Kind: "quick"})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		c, err := client.Wait(ctx, id)
		if err == nil && c.Status != supervisor.StatusCancelled {
			t.Errorf("Wait returned %s, want CANCELLED", c.Status)
		}
		ended <- err
	}()
	testenv.Eventually(t, time.Minute, "Wait's first read", func() (bool, error) { return looks.n.Load() > 0, nil })

	base, start := looks.n.Load(), time.Now()
	for range 5 {
		if _, err := env.Pool.Exec(ctx, `
			SELECT pg_notify($1, json_build_object('etl_context_id', $2::bigint, 'n', g)::text)
			  FROM generate_series(1, 4000) AS g`, etlcontext.FinishedChannel, id); err != nil {
			t.Fatal(err)
		}
	}
	// Through a client of its own, whose reads are not counted.
	operator, err := supervisor.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	var waited error
	testenv.Eventually(t, time.Minute, "Wait to return", func() (bool, error) {
		select {
		case waited = <-ended:
			return true, nil
		default:
			return false, nil
		}
	})
	if waited != nil {
		t.Fatal(waited)
	}
	elapsed, n := time.Since(start), looks.n.Load()-base
	t.Logf("%d reads in %s for 20,000 false announcements and the true one", n, elapsed.Round(time.Millisecond))
	// One per 100 ms, the recheck every 10 s, and the one that finds it
	// cancelled.
	if limit := int64(elapsed/(100*time.Millisecond)) + int64(elapsed/(10*time.Second)) + 2; n > limit {
		t.Errorf("%d reads in %s, want at most %d", n, elapsed, limit)
	}
}
