package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
)

// left counts what is left of task id: its context, events, attempts and
// River job.
func (w *world) left(id int64) string {
	w.T.Helper()
	var contexts, events, attempts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM data_manager.etl_contexts WHERE etl_context_id = $1),
		       (SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1),
		       (SELECT count(*) FROM data_manager.etl_attempts WHERE etl_context_id = $1),
		       (SELECT count(*) FROM river_job WHERE args->'etl_context_id' = to_jsonb($1::bigint))`, id).Scan(&contexts, &events, &attempts, &jobs); err != nil {
		w.T.Fatal(err)
	}
	return fmt.Sprintf("%d context, %d events, %d attempts, %d jobs", contexts, events, attempts, jobs)
}

const nothingLeft = "0 context, 0 events, 0 attempts, 0 jobs"

// Past retention, the supervisor removes a finished task with everything of
// its own, and keeps a task that runs however old it is.
//
// What was removed, and when, is recorded by the database as it happens
// (a trigger on etl_contexts): the test need not read a task between its
// finish and its removal, which a --slow run's machine, 30 to 60 times
// slower by a fork/exec, once left it unscheduled for the whole window.
func TestRetentionRemovesFinishedTasksOnly(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	if _, err := env.Pool.Exec(ctx, `
		CREATE TABLE public.removed (etl_context_id bigint PRIMARY KEY, etl_status text, finished_at timestamptz, removed_at timestamptz);
		-- SECURITY DEFINER: the supervisor's role may not write here.
		CREATE FUNCTION public.record_removal() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
		BEGIN
			INSERT INTO public.removed VALUES (OLD.etl_context_id, OLD.etl_status::text, OLD.finished_at, clock_timestamp());
			RETURN OLD;
		END $$;
		CREATE TRIGGER record_removal AFTER DELETE ON data_manager.etl_contexts
			FOR EACH ROW EXECUTE FUNCTION public.record_removal()`); err != nil {
		t.Fatal(err)
	}
	// A few seconds: nothing needs reading before it is over.
	const retention = 3 * time.Second
	goFile := filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
retention: ` + retention.String() + `
kinds:
  sample: { command: ["{{sample}}"] }` + waiterKind(goFile, 1))
	w := &world{Env: env, cfg: cfg}
	// removal waits until task id is removed with everything of its own,
	// and returns what its context was then, and how long after its finish
	// it went.
	removal := func(id int64, msg string) (status string, after time.Duration) {
		t.Helper()
		testenv.Eventually(t, retention+time.Minute, msg, func() (bool, error) {
			left := w.left(id)
			return left == nothingLeft, fmt.Errorf("%s left", left)
		})
		if err := env.Pool.QueryRow(ctx, `
			SELECT etl_status, removed_at - finished_at FROM public.removed WHERE etl_context_id = $1`, id).Scan(&status, &after); err != nil {
			t.Fatalf("read the removal of task %d: %v", id, err)
		}
		return status, after
	}
	w.Start(cfg, "supervisor")
	done := w.submitOf("sample", "--args", `{"steps": 2, "step_ms": 10}`)
	running := w.submitOf("waiter")
	w.waitRunning(running)
	// Removed no sooner than its retention, by the database's clock.
	if status, after := removal(done, "the finished task to be removed past its retention"); status != string(etlcontext.StatusDone) || after < retention {
		t.Errorf("the finished task was %s, removed %s after it finished; want DONE, removed no sooner than its retention of %s", status, after, retention)
	}
	// The running task, older than the retention too, stays whole through
	// a later removal.
	var since time.Duration
	testenv.Eventually(t, retention+time.Minute, "the running task to run past the retention", func() (bool, error) {
		err := w.Pool.QueryRow(ctx, `
			SELECT now() - started_at FROM data_manager.etl_contexts WHERE etl_context_id = $1`, running).Scan(&since)
		return since > retention, err
	})
	later := w.submitOf("sample", "--args", `{"steps": 1, "step_ms": 10}`)
	if status, after := removal(later, "a task finished later to be removed"); status != string(etlcontext.StatusDone) || after < retention {
		t.Errorf("the later task was %s, removed %s after it finished; want DONE, removed no sooner than its retention of %s", status, after, retention)
	}
	if got := w.task(running); got.Status != etlcontext.StatusRunning || !got.InitialEventLocked || got.JobState == nil {
		t.Errorf("the running task: %s, locked %t, job %v; want it RUNNING with its lock and job", got.Status, got.InitialEventLocked, deref(got.JobState))
	}
}

// dama prune removes the finished tasks older than --older-than, once, and
// says what it removed; it refuses what it cannot read and a role that may
// not delete, in one line, removing nothing.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
retention: -1s
kinds:
  sample: { command: ["{{sample}}"] }
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	var ids []int64
	for range 3 {
		ids = append(ids, w.submitOf("sample", "--args", `{"steps": 1, "step_ms": 10}`))
	}
	for _, id := range ids {
		w.waitSettled(id, time.Minute)
	}
	for _, args := range [][]string{
		{"prune"},
		{"prune", "--older-than", "-1h"},
		{"prune", "--older-than", "30d"},
	} {
		res := w.Dama(cfg, args...)
		if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || res.Stdout != "" {
			t.Errorf("dama %s: exit %d, stdout %q, stderr %q; want one line on stderr and a failure", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
		}
	}
	asOperator := []string{"DATABASE_URL=" + env.NewLogin(sql.RoleOperator)}
	if res := env.DamaWith(cfg, asOperator, "prune", "--older-than", "0s"); res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 {
		t.Errorf("dama prune as an operator: exit %d, stderr %q; want a one-line refusal", res.Code, res.Stderr)
	}
	// An hour keeps them all.
	if res := w.Dama(cfg, "prune", "--older-than", "1h"); res.Code != 0 || res.Stdout != "removed 0 tasks, 0 events, 0 attempts, 0 River jobs\n" {
		t.Fatalf("dama prune --older-than 1h: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	for _, id := range ids {
		if got := w.left(id); got == nothingLeft {
			t.Fatalf("task %d removed by a refused or too young prune", id)
		}
	}
	// A supervisor's role may remove them, and may delete no event itself,
	// whatever it says in dama.pruning.
	supURL := env.NewLogin(sql.RoleSupervisor)
	asSupervisor := []string{"DATABASE_URL=" + supURL}
	sup, err := pgx.Connect(context.Background(), supURL)
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close(context.Background())
	if _, err := sup.Exec(context.Background(), `SET dama.pruning = 'on'`); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Exec(context.Background(), `DELETE FROM data_manager.event_store WHERE etl_context_id = $1`, ids[0]); err == nil {
		t.Error("a supervisor's role deleted a finished task's events")
	}
	res := env.DamaWith(cfg, asSupervisor, "prune", "--older-than", "0s")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "removed 3 tasks, ") || !strings.HasSuffix(res.Stdout, ", 3 attempts, 3 River jobs\n") {
		t.Fatalf("dama prune --older-than 0s: exit %d, %q %q; want 3 tasks with their attempts and jobs removed", res.Code, res.Stdout, res.Stderr)
	}
	for _, id := range ids {
		if got := w.left(id); got != nothingLeft {
			t.Errorf("task %d: %s left", id, got)
		}
	}
}
