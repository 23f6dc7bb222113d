package dama_test

import (
	"context"
	"testing"
	"time"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

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
	pool, looks := testenv.CountingPool(t, env, "WHERE c.etl_context_id = $1")
	client, err := dama.NewClient(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// No supervisor runs: the task waits until it is cancelled.
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "quick"})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		c, err := client.Wait(ctx, id)
		if err == nil && c.Status != etlcontext.StatusCancelled {
			t.Errorf("Wait returned %s, want CANCELLED", c.Status)
		}
		ended <- err
	}()
	testenv.Eventually(t, time.Minute, "Wait's first read", func() (bool, error) { return looks.Load() > 0, nil })

	base, start := looks.Load(), time.Now()
	for range 5 {
		if _, err := env.Pool.Exec(ctx, `
			SELECT pg_notify($1, json_build_object('etl_context_id', $2::bigint, 'n', g)::text)
			  FROM generate_series(1, 4000) AS g`, etlcontext.FinishedChannel, id); err != nil {
			t.Fatal(err)
		}
	}
	// Through a client of its own, whose reads are not counted.
	operator, err := dama.NewClient(env.Pool, cfg)
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
	elapsed, n := time.Since(start), looks.Load()-base
	t.Logf("%d reads in %s for 20,000 false announcements and the true one", n, elapsed.Round(time.Millisecond))
	// One per 100 ms, the recheck every 10 s, and the one that finds it
	// cancelled.
	if limit := int64(elapsed/(100*time.Millisecond)) + int64(elapsed/(10*time.Second)) + 2; n > limit {
		t.Errorf("%d reads in %s, want at most %d", n, elapsed, limit)
	}
}
