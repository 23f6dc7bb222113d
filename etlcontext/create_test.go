package etlcontext_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func create(t *testing.T, db etlcontext.DB, kind, key string) (int64, bool, error) {
	t.Helper()
	return etlcontext.CreateTask(context.Background(), db, etlcontext.NewTask{Kind: kind, Queue: "q", MaxAttempts: 1, IdempotencyKey: key})
}

func countContexts(t *testing.T, env *testenv.Env) int {
	t.Helper()
	var n int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_contexts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestIdempotencyKeyBelongsToOneKind(t *testing.T) {
	env := testenv.New(t)
	id, created, err := create(t, env.Pool, "a", "K")
	if err != nil || !created {
		t.Fatalf("first use of the key: id %d, created %v, %v", id, created, err)
	}
	again, created, err := create(t, env.Pool, "a", "K")
	if err != nil || created || again != id {
		t.Errorf("same kind again: id %d, created %v, %v; want %d, false, nil", again, created, err, id)
	}
	other, created, err := create(t, env.Pool, "b", "K")
	if !errors.Is(err, etlcontext.ErrIdempotencyKeyOtherKind) || created || other != 0 {
		t.Errorf("another kind: id %d, created %v, %v; want 0, false, ErrIdempotencyKeyOtherKind", other, created, err)
	}
	if n := countContexts(t, env); n != 1 {
		t.Errorf("%d contexts, want 1", n)
	}
}

// A submission of a key with another kind, made while the key's first
// submission is not yet committed, waits for it and then sees it: the two
// never both succeed. If the first rolls back, the second creates.
func TestIdempotencyKeyOfAConcurrentSubmissionOfAnotherKind(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	for _, c := range []struct {
		name        string
		commitFirst bool
	}{{"first commits", true}, {"first rolls back", false}} {
		t.Run(c.name, func(t *testing.T) {
			key := "concurrent-" + c.name
			first, err := env.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx)
			if _, created, err := create(t, first, "a", key); err != nil || !created {
				t.Fatalf("first submission: created %v, %v", created, err)
			}
			conn, err := env.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			var pid int
			if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			type result struct {
				created bool
				err     error
			}
			second := make(chan result, 1)
			go func() {
				var r result
				r.err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					var err error
					_, r.created, err = etlcontext.CreateTask(ctx, tx, etlcontext.NewTask{Kind: "b", Queue: "q", MaxAttempts: 1, IdempotencyKey: key})
					return err
				})
				second <- r
			}()
			// Only a second submission caught in the middle shows the race.
			testenv.Eventually(t, 10*time.Second, "second submission waits for the first", func() (bool, error) {
				var waiting bool
				err := env.Pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
				return waiting, err
			})
			if c.commitFirst {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-second
			switch {
			case c.commitFirst && (!errors.Is(r.err, etlcontext.ErrIdempotencyKeyOtherKind) || r.created):
				t.Errorf("second submission after the first committed: created %v, %v; want ErrIdempotencyKeyOtherKind", r.created, r.err)
			case !c.commitFirst && (r.err != nil || !r.created):
				t.Errorf("second submission after the first rolled back: created %v, %v; want created", r.created, r.err)
			}
			rows, _ := env.Pool.Query(ctx, `SELECT kind FROM data_manager.etl_contexts WHERE idempotency_key = $1`, key)
			kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			want := "b"
			if c.commitFirst {
				want = "a"
			}
			if len(kinds) != 1 || kinds[0] != want {
				t.Errorf("contexts of the key have kinds %v, want [%s]", kinds, want)
			}
		})
	}
}

// The database's limits of a submission are the Go side's: the arguments
// a task receives in DAMA_ARGS (protocol.MaxEnvPayload) and the length of a
// concurrency key (config.MaxConcurrencyKey).
func TestCreateTaskHoldsTheLimitsOfGo(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	var maxArgs int
	if err := env.Pool.QueryRow(ctx, `SELECT data_manager.max_args_bytes()`).Scan(&maxArgs); err != nil || maxArgs != protocol.MaxEnvPayload {
		t.Errorf("data_manager.max_args_bytes() = %d (%v), want protocol.MaxEnvPayload, %d", maxArgs, err, protocol.MaxEnvPayload)
	}
	key := func(n int) error {
		args, _ := json.Marshal(map[string]string{"region": strings.Repeat("r", n)})
		_, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 1, Args: args, ConcurrencyField: "region"})
		return err
	}
	if err := key(config.MaxConcurrencyKey); err != nil {
		t.Errorf("a concurrency key of config.MaxConcurrencyKey bytes: %v", err)
	}
	if err := key(config.MaxConcurrencyKey + 1); !errors.Is(err, etlcontext.ErrRefused) {
		t.Errorf("a concurrency key of config.MaxConcurrencyKey+1 bytes: %v, want ErrRefused", err)
	}
}
