package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/internal/etlcontext"
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
func TestRetentionRemovesFinishedTasksOnly(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	// Long enough for this test to read a task between its finish and its
	// removal, on this machine now: 5 s on an idle one. A --slow run's
	// machine, 30 to 60 times slower by a fork/exec, once left this test
	// unscheduled for the whole 5 s.
	retention := (time.Duration(float64(5*time.Second) * testenv.Slowness())).Round(time.Second)
	t.Logf("retention %s; %s", retention, testenv.Pace())
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
retention: ` + retention.String() + `
kinds:
  sample: { command: ["{{sample}}"] }` + waiterKind(goFile, 1))
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	done := w.submitOf("sample", "--args", `{"steps": 2, "step_ms": 10}`)
	running := w.submitOf("waiter")
	// Read as soon as it is DONE: its River job may be completed later
	// than that on a busy machine, and the task removed within a moment
	// of it.
	got := w.waitFor(done, time.Minute, "to finish", func(t etlcontext.Task) bool { return t.Status.Finished() })
	if got.Status != etlcontext.StatusDone || got.FinishedAt == nil {
		t.Fatalf("%s, finished at %v; want DONE", got.Status, deref(got.FinishedAt))
	}
	w.waitRunning(running)
	testenv.Eventually(t, retention+time.Minute, "the finished task to be removed past its retention", func() (bool, error) {
		left := w.left(done)
		return left == nothingLeft, fmt.Errorf("%s left", left)
	})
	// Removed no sooner than its retention, by the database's clock (this
	// wait looks every 20 ms).
	var since time.Duration
	if err := w.Pool.QueryRow(context.Background(), `SELECT now() - $1::timestamptz`, *got.FinishedAt).Scan(&since); err != nil {
		t.Fatal(err)
	}
	if since < retention {
		t.Errorf("the finished task was removed %s after it finished, within its retention of %s", since, retention)
	}
	// The running task, older than the retention too, stays whole through
	// a later removal.
	testenv.Eventually(t, retention+time.Minute, "the running task to run past the retention", func() (bool, error) {
		err := w.Pool.QueryRow(context.Background(), `
			SELECT now() - started_at FROM data_manager.etl_contexts WHERE etl_context_id = $1`, running).Scan(&since)
		return since > retention, err
	})
	later := w.submitOf("sample", "--args", `{"steps": 1, "step_ms": 10}`)
	w.waitSettled(later, time.Minute)
	testenv.Eventually(t, retention+time.Minute, "a task finished later to be removed", func() (bool, error) {
		left := w.left(later)
		return left == nothingLeft, fmt.Errorf("%s left", left)
	})
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
