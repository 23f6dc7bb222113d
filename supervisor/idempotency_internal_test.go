package supervisor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/submit"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/taskrunner"
)

const idempotencyTestConfig = `
log_dir: {{dir}}/logs
queues:
  etl: { max_running: 10 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  other: { queue: etl, command: ["{{sample}}"] }
  ticked: { queue: etl, command: ["{{sample}}"], schedule: "@hourly", overlap: allow }
`

// counts returns how many contexts and River jobs the database holds.
func counts(t *testing.T, env *testenv.Env) (contexts, jobs int) {
	t.Helper()
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	return contexts, jobs
}

// newTestClient returns a database for t and a Client of
// idempotencyTestConfig's kinds over it.
func newTestClient(t *testing.T) (*testenv.Env, *config.Config, *dama.Client) {
	t.Helper()
	env := testenv.New(t)
	cfg, err := config.Load(env.WriteConfig(idempotencyTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return env, cfg, client
}

func TestIdempotencyKeyBelongsToOneKindAndDamasPrefixToDama(t *testing.T) {
	env, cfg, client := newTestClient(t)
	ctx := context.Background()

	id, created, err := client.Submit(ctx, dama.SubmitParams{Kind: "sample", IdempotencyKey: "nightly"})
	if err != nil || !created {
		t.Fatalf("first submission: created %v, %v", created, err)
	}
	again, created, err := client.Submit(ctx, dama.SubmitParams{Kind: "sample", IdempotencyKey: "nightly", Args: []byte(`{"steps": 9}`)})
	if err != nil || created || again != id {
		t.Errorf("same kind again: id %d, created %v, %v; want %d, false, nil", again, created, err, id)
	}
	other, created, err := client.Submit(ctx, dama.SubmitParams{Kind: "other", IdempotencyKey: "nightly"})
	if !errors.Is(err, dama.ErrIdempotencyKeyOtherKind) || !errors.Is(err, etlcontext.ErrIdempotencyKeyOtherKind) || other != 0 || created {
		t.Errorf("another kind: id %d, created %v, %v; want dama.ErrIdempotencyKeyOtherKind", other, created, err)
	}
	// Refused in a savepoint: the caller's transaction goes on.
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		if _, _, err := client.SubmitTx(ctx, tx, dama.SubmitParams{Kind: "other", IdempotencyKey: "nightly"}); !errors.Is(err, dama.ErrIdempotencyKeyOtherKind) {
			t.Errorf("SubmitTx of another kind: %v, want dama.ErrIdempotencyKeyOtherKind", err)
		}
		_, _, err := client.SubmitTx(ctx, tx, dama.SubmitParams{Kind: "other", IdempotencyKey: "nightly-other"})
		return err
	})
	if err != nil {
		t.Errorf("transaction after a refused SubmitTx: %v", err)
	}
	if c, j := counts(t, env); c != 2 || j != 2 {
		t.Fatalf("%d contexts and %d jobs, want 2 and 2", c, j)
	}

	tick := time.Date(2026, 11, 21, 2, 0, 0, 0, time.UTC)
	childKey := "dama:child:1:part-1"
	for _, key := range []string{"dama:", "dama:mine", TickKey("ticked", tick), childKey} {
		_, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "sample", IdempotencyKey: key})
		if !errors.Is(err, dama.ErrReservedIdempotencyKey) {
			t.Errorf("Submit with key %q: %v, want dama.ErrReservedIdempotencyKey", key, err)
		}
		err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
			_, _, err := client.SubmitTx(ctx, tx, dama.SubmitParams{Kind: "sample", IdempotencyKey: key})
			return err
		})
		if !errors.Is(err, dama.ErrReservedIdempotencyKey) {
			t.Errorf("SubmitTx with key %q: %v, want dama.ErrReservedIdempotencyKey", key, err)
		}
	}
	if c, j := counts(t, env); c != 2 || j != 2 {
		t.Fatalf("after reserved keys: %d contexts and %d jobs, want 2 and 2", c, j)
	}

	// A task process submits its children with keys of dama's own, by the
	// function runnerOptions gives the runner, of the kinds its kind's
	// published children name (migration 33).
	if _, err := etlcontext.PublishKinds(ctx, env.Pool, []etlcontext.PublishedKind{{Kind: "sample", Queue: "etl", MaxAttempts: 3, Children: []string{"other", "sample"}, PublishedBy: "test", Release: "test"}}); err != nil {
		t.Fatal(err)
	}
	var submitChild taskrunner.SubmitFunc = submit.New(cfg).Child
	child := protocol.Child{Kind: "other", IdempotencyKey: childKey, ParentID: id}
	var childID int64
	for i, wantCreated := range []bool{true, false} {
		err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
			got, created, err := submitChild(ctx, tx, child)
			if err == nil && (created != wantCreated || (i > 0 && got != childID)) {
				t.Errorf("child submission %d: id %d, created %v; want created %v and the first id %d", i+1, got, created, wantCreated, childID)
			}
			childID = got
			return err
		})
		if err != nil {
			t.Fatalf("child submission %d: %v", i+1, err)
		}
	}
	child.Kind = "sample"
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		_, _, err := submitChild(ctx, tx, child)
		return err
	})
	if !errors.Is(err, dama.ErrIdempotencyKeyOtherKind) {
		t.Errorf("child key again with another kind: %v, want dama.ErrIdempotencyKeyOtherKind", err)
	}

	// A schedule's tick submits with its TickKey.
	s := newTestSupervisor(t, env, env.Pool, cfg)
	k := cfg.Kinds["ticked"]
	sched, err := k.ScheduleOf()
	if err != nil || sched == nil {
		t.Fatalf("schedule of ticked: %v, %v", sched, err)
	}
	if _, err := s.takeTick(ctx, "ticked", k, sched); err != nil {
		t.Fatalf("first look at the schedule: %v", err)
	}
	// As if the supervisors had stopped for two hours: the latest tick is due.
	if _, err := env.Pool.Exec(ctx, `UPDATE data_manager.schedules SET last_tick = last_tick - interval '2 hours' WHERE kind = 'ticked'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.takeTick(ctx, "ticked", k, sched); err != nil {
		t.Fatalf("take the due tick: %v", err)
	}
	var key string
	if err := env.Pool.QueryRow(ctx, `
		SELECT c.idempotency_key FROM data_manager.schedules s JOIN data_manager.etl_contexts c ON c.etl_context_id = s.last_context_id
		 WHERE s.kind = 'ticked' AND s.last_outcome = 'submitted'`).Scan(&key); err != nil {
		t.Fatalf("the tick's task: %v", err)
	}
	if !strings.HasPrefix(key, "dama:schedule:ticked:") {
		t.Errorf("the tick's task has key %q, want dama:schedule:ticked:…", key)
	}
}
