package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

const internalTestConfig = `
log_dir: {{dir}}/logs
poll_interval: 500ms
queues:
  etl: { max_running: 100 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
`

// newTestSupervisor returns a Supervisor on pool that is never Run: the tests
// call its background duties (reconcile, rescueOrphanedSteps) themselves.
func newTestSupervisor(t *testing.T, env *testenv.Env, pool *pgxpool.Pool, cfg *config.Config) *Supervisor {
	t.Helper()
	s, err := New(pool, cfg, Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func loadTestConfig(t *testing.T, env *testenv.Env) *config.Config {
	t.Helper()
	cfg, err := config.Load(env.WriteConfig(internalTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func submitN(t *testing.T, env *testenv.Env, cfg *config.Config, n int) []int64 {
	t.Helper()
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, 0, n)
	for range n {
		id, _, err := client.Submit(context.Background(), dama.SubmitParams{Kind: "sample"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// Two supervisors reconciling at once both see every context's job gone;
// each context must still end up with exactly one job, the one its
// river_job_id names.
func TestConcurrentReconcilesGiveEachContextOneJob(t *testing.T) {
	env := testenv.New(t)
	cfg := loadTestConfig(t, env)
	const contexts, rounds = 40, 5
	submitN(t, env, cfg, contexts)
	ctx := context.Background()
	// A pool of its own for the second supervisor, as on another host.
	otherPool, err := pgxpool.New(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer otherPool.Close()
	sups := []*Supervisor{newTestSupervisor(t, env, env.Pool, cfg), newTestSupervisor(t, env, otherPool, cfg)}

	for round := range rounds {
		if _, err := env.Pool.Exec(ctx, `DELETE FROM river_job`); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make([]error, len(sups))
		var wg sync.WaitGroup
		for i, s := range sups {
			wg.Go(func() {
				<-start
				errs[i] = s.reconcile(ctx)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: reconcile of supervisor %d: %v", round, i, err)
			}
		}
		rows, err := env.Pool.Query(ctx, `
			SELECT c.etl_context_id, count(j.id), coalesce(bool_or(j.id = c.river_job_id), false)
			  FROM data_manager.etl_contexts AS c
			  LEFT JOIN river_job AS j ON j.args->>'etl_context_id' = c.etl_context_id::text
			 GROUP BY c.etl_context_id
			 ORDER BY c.etl_context_id`)
		if err != nil {
			t.Fatal(err)
		}
		type jobs struct {
			id    int64
			count int
			named bool
		}
		got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (jobs, error) {
			var j jobs
			err := row.Scan(&j.id, &j.count, &j.named)
			return j, err
		})
		if err != nil {
			t.Fatal(err)
		}
		var bad []string
		for _, g := range got {
			if g.count != 1 || !g.named {
				bad = append(bad, fmt.Sprintf("%d: %d jobs, river_job_id names one: %v", g.id, g.count, g.named))
			}
		}
		if len(got) != contexts || len(bad) > 0 {
			t.Fatalf("round %d: %d contexts; %d without exactly one job named by river_job_id:\n%s",
				round, len(got), len(bad), strings.Join(bad, "\n"))
		}
	}
}

// A running job whose client's liveness lock is missing is rescued only once
// the lock has been seen missing for the whole grace; a lock seen back makes
// the supervisor forget the job; and only current suspects are remembered.
func TestRescueWaitsOutTheGraceAndForgets(t *testing.T) {
	env := testenv.New(t)
	cfg := loadTestConfig(t, env)
	ctx := context.Background()
	ids := submitN(t, env, cfg, 2)
	s := newTestSupervisor(t, env, env.Pool, cfg)
	if s.rescueGrace != minRescueGrace {
		t.Fatalf("grace for a 500ms poll interval: %s, want %s", s.rescueGrace, minRescueGrace)
	}
	s.rescueGrace = 1500 * time.Millisecond

	// The step of supervisor "ghost" (which holds no lock) on the first
	// context; a step of "ancient", whose lock is held, far older than a
	// Work's timeout on the second.
	fake := func(id int64, client string, age time.Duration) int64 {
		var job int64
		if err := env.Pool.QueryRow(ctx, `
			UPDATE river_job AS j
			   SET state = 'running', attempt = 1, attempted_at = now() - $3::interval, attempted_by = ARRAY[$2]
			  FROM data_manager.etl_contexts AS c
			 WHERE c.etl_context_id = $1 AND j.id = c.river_job_id
			RETURNING j.id`, id, client, age).Scan(&job); err != nil {
			t.Fatal(err)
		}
		return job
	}
	ghostJob := fake(ids[0], "ghost", 2*time.Second)
	ancientJob := fake(ids[1], "ancient", workTimeout(s.opts.LaunchTimeout)+stepTimeout(s.opts.LaunchTimeout)+time.Minute)
	holdLock := func(client string) *pgx.Conn {
		conn, err := pgx.Connect(ctx, env.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, etlcontext.ClientLockNamespace, client); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	holdLock("ancient")
	state := func(job int64) (string, int) {
		var (
			st      string
			attempt int
		)
		if err := env.Pool.QueryRow(ctx, `SELECT state, attempt FROM river_job WHERE id = $1`, job).Scan(&st, &attempt); err != nil {
			t.Fatal(err)
		}
		return st, attempt
	}
	rescue := func() {
		t.Helper()
		if err := s.rescueOrphanedSteps(ctx); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(job int64, wantState string, wantAttempt, wantSuspects int) {
		t.Helper()
		if st, attempt := state(job); st != wantState || attempt != wantAttempt {
			t.Fatalf("job %d: %s at attempt %d, want %s at attempt %d", job, st, attempt, wantState, wantAttempt)
		}
		if len(s.suspects) != wantSuspects {
			t.Fatalf("%d suspects remembered, want %d: %v", len(s.suspects), wantSuspects, s.suspects)
		}
	}

	// First look: the ancient step is rescued on sight, lock or not; the
	// ghost's is only suspected.
	rescue()
	expect(ancientJob, "available", 0, 1)
	expect(ghostJob, "running", 1, 1)

	// The ghost takes its lock back, as a supervisor whose liveness
	// connection failed does: it is forgotten, and never rescued however
	// long it keeps the lock.
	ghost := holdLock("ghost")
	rescue()
	expect(ghostJob, "running", 1, 0)
	testenv.Holds(s.rescueGrace+200*time.Millisecond, func() bool {
		rescue()
		expect(ghostJob, "running", 1, 0)
		return true
	})

	// Its lock gone again, the ghost is suspected afresh and rescued once
	// the whole grace has passed since, without spending an attempt.
	ghost.Close(ctx)
	testenv.Eventually(t, 10*time.Second, "the ghost's lock to be released", func() (bool, error) {
		var held bool
		err := env.Pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
			                  AND classid = $1 AND objid = hashtext('ghost')::oid)`, etlcontext.ClientLockNamespace).Scan(&held)
		return !held, err
	})
	lost := time.Now()
	rescue()
	expect(ghostJob, "running", 1, 1)
	testenv.Eventually(t, 10*time.Second, "the ghost's step to be rescued", func() (bool, error) {
		rescue()
		st, _ := state(ghostJob)
		return st == "available", nil
	})
	if waited := time.Since(lost); waited < s.rescueGrace {
		t.Errorf("rescued %s after the lock was seen missing, want at least the grace %s", waited, s.rescueGrace)
	}
	expect(ghostJob, "available", 0, 1)
	// The next look no longer finds it running, and forgets it.
	rescue()
	expect(ghostJob, "available", 0, 0)
}

// A task whose lock is free while a supervisor that is gone holds its job:
// another's watch times the loss at once, so that the fencing window runs
// while the job waits for its rescue. It marks no task whose lock is held,
// or whose task process never took it, and waits for no row another holds.
func TestTheWatchTimesALossWhoseJobIsHeldElsewhere(t *testing.T) {
	env := testenv.New(t)
	cfg := loadTestConfig(t, env)
	ctx := context.Background()
	ids := submitN(t, env, cfg, 4) // lost, held, never locked, its row held
	for i, id := range ids {
		if _, err := env.Pool.Exec(ctx, `
			UPDATE data_manager.etl_contexts
			   SET etl_status = 'RUNNING', attempt = 1, run_id = gen_random_uuid(), pid = CASE WHEN $2 THEN 4242 END
			 WHERE etl_context_id = $1`, id, i != 2); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Pool.Exec(ctx, `
			UPDATE river_job AS j SET state = 'running', attempt = 1, attempted_at = now(), attempted_by = ARRAY['ghost']
			  FROM data_manager.etl_contexts AS c
			 WHERE c.etl_context_id = $1 AND j.id = c.river_job_id`, id); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, $2::int)`, protocol.LockNamespace, ids[1]); err != nil {
		t.Fatal(err)
	}
	// A transaction of anyone who may update the task (its own task
	// process's role) holds the last one's row for as long as it likes.
	holder, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM data_manager.etl_contexts WHERE etl_context_id = $1 FOR UPDATE`, ids[3]); err != nil {
		t.Fatal(err)
	}
	s := newTestSupervisor(t, env, env.Pool, cfg)
	look := func() map[int64]time.Time {
		t.Helper()
		// Far longer than a look takes: one that waits on the held row
		// fails here.
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := s.watch(wctx); err != nil {
			t.Fatal(err)
		}
		rows, err := env.Pool.Query(ctx, `SELECT etl_context_id, lock_lost_at FROM data_manager.etl_contexts WHERE lock_lost_at IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		marks := map[int64]time.Time{}
		var l etlcontext.Loss
		if _, err := pgx.ForEachRow(rows, []any{&l.ID, &l.Mark}, func() error { marks[l.ID] = l.Mark; return nil }); err != nil {
			t.Fatal(err)
		}
		return marks
	}
	marks := look()
	seen, ok := s.fence.seen[ids[0]]
	if len(marks) != 1 || !ok || !seen.mark.Equal(marks[ids[0]]) || len(s.fence.seen) != 1 {
		t.Fatalf("marks %v, sightings %v: want task %d's loss marked and timed, alone", marks, s.fence.seen, ids[0])
	}
	// The next look keeps the first sighting.
	if again := look(); !again[ids[0]].Equal(marks[ids[0]]) || !s.fence.seen[ids[0]].since.Equal(seen.since) {
		t.Fatalf("the next look marked %v, timed from %v: want %v from %v", again, s.fence.seen[ids[0]].since, marks, seen.since)
	}
	// A lock taken again between the watch's look and the mark is no loss.
	if lost, err := etlcontext.MarkLocksLost(ctx, env.Pool, ids[1:2]); err != nil || len(lost) != 0 {
		t.Fatalf("marked a held lock lost: %v, %v", lost, err)
	}
}
