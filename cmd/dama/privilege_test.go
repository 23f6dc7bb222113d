package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/sql"
)

// A member of dama_reader reads everything dama shows, with dama's
// commands and with SQL, and can change nothing.
func TestAReaderReadsAndChangesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  sample: { command: ["{{sample}}"] }
  nightly: { command: ["{{sample}}"], schedule: "@daily" }
`)
	w := &world{Env: env, cfg: cfg}
	res := w.Dama(cfg, "submit", "sample")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := strings.TrimSpace(res.Stdout)
	asReader := []string{"DATABASE_URL=" + env.NewLogin(sql.RoleReader)}
	for _, args := range [][]string{{"status"}, {"status", id}, {"status", "--json"}, {"events", id}, {"queues"}, {"schedules"}} {
		if res := env.DamaWith(cfg, asReader, args...); res.Code != 0 {
			t.Errorf("dama %v as a reader: exit %d, %s", args, res.Code, res.Stderr)
		}
	}
	for _, args := range [][]string{{"cancel", id, "--wait", "5s"}, {"pause", "default"}, {"submit", "sample"}} {
		res := env.DamaWith(cfg, asReader, args...)
		if res.Code == 0 || !strings.Contains(res.Stderr, "permission denied") || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 {
			t.Errorf("dama %v as a reader: exit %d, %q; want one line refusing it", args, res.Code, res.Stderr)
		}
	}
	ctx := context.Background()
	reader, err := pgx.Connect(ctx, strings.TrimPrefix(asReader[0], "DATABASE_URL="))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(ctx)
	var n int
	if err := reader.QueryRow(ctx, `SELECT count(*) FROM data_manager.dama_task_queue`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the view as a reader: %d rows, %v; want 1", n, err)
	}
	for _, stmt := range []string{
		`UPDATE data_manager.etl_contexts SET queue = 'elsewhere'`,
		`DELETE FROM data_manager.event_store`,
		`INSERT INTO data_manager.event_store (etl_context_id, type) VALUES (` + id + `, 'sample:FINAL')`,
		`UPDATE river_job SET state = 'cancelled'`,
		`DELETE FROM data_manager.etl_attempts`,
	} {
		_, err := reader.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as a reader: %v, want permission denied", stmt, err)
		}
	}
	if got := w.task(testenv.Atoi(t, id)); got.Status != etlcontext.StatusQueued || got.CancelRequestedAt != nil {
		t.Errorf("after a reader's tries: %s, cancel requested at %v; want QUEUED, untouched", got.Status, got.CancelRequestedAt)
	}
}

// Each role does its work, and no more: a supervisor logged in as a member
// of dama_supervisor, its task processes as members of dama_task, an
// operator as a member of dama_operator run, cancel, retry, pause and
// block tasks, children included; what else each tries is refused.
func TestEachRoleDoesItsWorkAndNoMore(t *testing.T) {
	testenv.LockModes(t, testEachRoleDoesItsWorkAndNoMore)
}

func testEachRoleDoesItsWorkAndNoMore(t *testing.T) {
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  sample: { command: ["{{sample}}"] }
  parent:
    command: ["/bin/sh", "-c", "echo '{\"type\":\"submit\",\"payload\":{\"kind\":\"sample\"}}' >&3"]
    children: [sample]
    await_children: true` + waiterKind(goFile, 1))
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(env.Dir, "logs", "*.log"))
			for _, f := range logs {
				b, _ := os.ReadFile(f)
				t.Logf("%s:\n%s", f, b)
			}
		}
	})
	supURL, taskURL, opURL := env.NewLogin(sql.RoleSupervisor), env.NewLogin(sql.RoleTask), env.NewLogin(sql.RoleOperator)
	asOperator := []string{"DATABASE_URL=" + opURL}
	env.StartWith(cfg, []string{"DATABASE_URL=" + supURL, "DAMA_TASK_DATABASE_URL=" + taskURL}, nil, "supervisor")
	w := &world{Env: env, cfg: cfg}
	submit := func(kind string) int64 {
		t.Helper()
		res := env.DamaWith(cfg, asOperator, "submit", kind)
		if res.Code != 0 {
			t.Fatalf("submit %s as an operator: %s", kind, res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}
	parent := submit("parent")
	waiter := submit("waiter")
	if got := w.waitSettled(parent, time.Minute); got.Status != etlcontext.StatusDone || got.Children[etlcontext.StatusDone] != 1 {
		t.Fatalf("the parent %s with children %v, want DONE with its child DONE", got.Status, got.Children)
	}
	w.waitFor(waiter, 30*time.Second, "to run its command", func(t etlcontext.Task) bool { return t.CommandPGID != nil && t.InitialEventLocked })
	if res := env.DamaWith(cfg, asOperator, "cancel", strconv.FormatInt(waiter, 10)); res.Code != 0 {
		t.Fatalf("dama cancel as an operator: exit %d, %s", res.Code, res.Stderr)
	}
	w.waitSettled(waiter, time.Minute)
	for _, args := range [][]string{
		{"retry", strconv.FormatInt(waiter, 10)},
		{"pause", "default", "--reason", "test"}, {"resume", "default"},
		{"block", "sample", "--reason", "test"}, {"unblock", "sample"},
	} {
		if res := env.DamaWith(cfg, asOperator, args...); res.Code != 0 {
			t.Errorf("dama %v as an operator: exit %d, %s", args, res.Code, res.Stderr)
		}
	}
	// An operator may not write the running task's outcome.
	w.waitFor(waiter, 30*time.Second, "to run again", func(t etlcontext.Task) bool { return t.Attempt == 2 && t.CommandPGID != nil })
	operator, err := pgx.Connect(context.Background(), opURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = operator.Exec(context.Background(), `
		INSERT INTO data_manager.event_store (etl_context_id, type, run_id)
		SELECT etl_context_id, kind || ':FINAL', run_id FROM data_manager.etl_contexts WHERE etl_context_id = $1`, waiter)
	operator.Close(context.Background())
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("a FINAL for the running task as an operator: %v, want permission denied", err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(waiter, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("the cancelled and retried task: %s at attempt %d, want DONE at attempt 2", got.Status, got.Attempt)
	}
	// The test's own: roles are the server's, shared with the tests
	// running beside it.
	op, err := url.Parse(opURL)
	if err != nil {
		t.Fatal(err)
	}
	opRole := op.User.Username()
	if by, err := etlcontext.LatestPayload(context.Background(), env.Pool, waiter, protocol.EventCancelRequested); err != nil || !strings.Contains(string(by), "(database role "+opRole+")") {
		t.Errorf("CANCEL_REQUESTED %s, %v: want it to name the operator's role %s", by, err, opRole)
	}
	// The database stamps the role, whatever the writer says: an operator
	// writing in another's name is still named.
	later := env.DamaWith(cfg, asOperator, "submit", "sample", "--delay", "1h")
	if later.Code != 0 {
		t.Fatalf("submit as an operator: %s", later.Stderr)
	}
	forger, err := pgx.Connect(context.Background(), opURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := forger.Exec(context.Background(), `
		INSERT INTO data_manager.event_store (etl_context_id, type, payload, meta)
		VALUES ($1, 'sample:CANCEL_REQUESTED', '{"by": "admin (database role postgres)"}', '{"database_role": "postgres"}')`, testenv.Atoi(t, later.Stdout)); err != nil {
		t.Errorf("a CANCEL_REQUESTED as an operator: %v", err)
	}
	forger.Close(context.Background())
	for what, query := range map[string]string{
		"the forged CANCEL_REQUESTED":     `SELECT meta->>'database_role' FROM data_manager.event_store WHERE etl_context_id = ` + later.Stdout + ` AND type = 'sample:CANCEL_REQUESTED'`,
		"the operator's CANCEL_REQUESTED": `SELECT meta->>'database_role' FROM data_manager.event_store WHERE etl_context_id = ` + strconv.FormatInt(waiter, 10) + ` AND type = 'waiter:CANCEL_REQUESTED'`,
		"the operator's submission":       `SELECT meta->>'database_role' FROM data_manager.event_store WHERE etl_context_id = ` + strconv.FormatInt(waiter, 10) + ` AND type = 'waiter:INITIAL'`,
		"the operator's pause":            `SELECT database_role FROM data_manager.control_events WHERE action = 'PAUSED'`,
	} {
		var role *string
		if err := env.Pool.QueryRow(context.Background(), query).Scan(&role); err != nil || role == nil || *role != opRole {
			t.Errorf("%s names database role %v (%v), want %s", what, role, err, opRole)
		}
	}

	id := strconv.FormatInt(parent, 10)
	refused := map[string][]string{
		taskURL: {
			`UPDATE data_manager.etl_contexts SET etl_status = 'DONE' WHERE etl_context_id = ` + id,
			`UPDATE data_manager.etl_contexts SET cancel_requested_at = now()`,
			`DELETE FROM data_manager.event_store`,
			`DELETE FROM data_manager.etl_attempts`,
			`DELETE FROM river_job`,
			`INSERT INTO data_manager.queue_pauses (queue, reason, paused_by) VALUES ('default', 'x', 'x')`,
		},
		opURL: {
			`INSERT INTO data_manager.event_store (etl_context_id, type) VALUES (` + id + `, 'parent:FINAL')`,
			`UPDATE data_manager.etl_contexts SET pid = 1`,
			`UPDATE data_manager.etl_contexts SET etl_status = 'DONE' WHERE etl_context_id = ` + id,
			`DELETE FROM data_manager.event_store`,
			`DELETE FROM river_job`,
			`UPDATE river_queue SET paused_at = now()`,
			`UPDATE river_job SET args = '{}', queue = 'elsewhere'`,
			`UPDATE data_manager.etl_contexts SET river_job_id = 1000000 WHERE etl_context_id = ` + id,
			`INSERT INTO river_job (args, kind, max_attempts, queue, state) VALUES ('{"etl_context_id": ` + id + `}', 'another_worker', 1, 'default', 'available')`,
			`INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts, idempotency_key) VALUES ('sample', 'default', 1, 'dama:child:` + id + `:x')`,
			`INSERT INTO data_manager.event_store (event_id, etl_context_id, type) OVERRIDING SYSTEM VALUE VALUES (1000000, ` + id + `, 'parent:CANCEL_REQUESTED')`,
		},
		supURL: {
			`CREATE TABLE data_manager.extra (i int)`,
			`ALTER TABLE data_manager.event_store DISABLE TRIGGER ALL`,
			`DROP TABLE data_manager.control_events`,
		},
	}
	for url, stmts := range refused {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range stmts {
			_, err := conn.Exec(context.Background(), stmt)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				t.Errorf("%s as %s: %v, want permission denied", stmt, conn.Config().User, err)
			}
		}
		conn.Close(context.Background())
	}
}

// An announcement of a task's exit, which any role may send, does not
// start a task that is not due yet.
func TestAnAnnouncedExitStartsNoTaskBeforeItsTime(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  sample: { command: ["{{sample}}"] }
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	later := w.submitOf("sample", "--delay", "1h")
	ctx := context.Background()
	intruder, err := pgx.Connect(ctx, env.NewLogin())
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close(ctx)
	if _, err := intruder.Exec(ctx, `SELECT pg_notify($1, $2)`, protocol.ExitedChannel, strconv.FormatInt(later, 10)); err != nil {
		t.Fatal(err)
	}
	// A task submitted after the announcement runs to its end: the
	// supervisor has heard the announcement by then.
	if got := w.waitSettled(w.submitOf("sample"), time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task due now: %s, want DONE", got.Status)
	}
	if got := w.task(later); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
		t.Errorf("the task due in an hour: %s at attempt %d, want QUEUED, not started", got.Status, got.Attempt)
	}
}

// A task process's role opens only its own run's rows, by the run's key:
// with one run's key, a member of dama_task writes that run's row, its
// events and its children, and can neither change nor lock another run's
// rows, nor River's jobs; without a key, it writes nothing.
func TestATaskProcessWritesOnlyItsOwnRun(t *testing.T) {
	testenv.LockModes(t, testATaskProcessWritesOnlyItsOwnRun)
}

func testATaskProcessWritesOnlyItsOwnRun(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	// Whose tasks may submit children of their own kind (migration 33).
	if _, err := etlcontext.PublishKinds(ctx, env.Pool, []etlcontext.PublishedKind{{Kind: "k", Queue: "q", MaxAttempts: 1, Children: []string{"k"}, PublishedBy: "test", Release: "test"}}); err != nil {
		t.Fatal(err)
	}
	launch := func() (int64, etlcontext.Run) {
		t.Helper()
		id, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		return id, env.Launch(id)
	}
	own, ownRun := launch()
	other, otherRun := launch()
	ownID, otherID := strconv.FormatInt(own, 10), strconv.FormatInt(other, 10)
	taskURL := env.NewLogin(sql.RoleTask)
	connectWith := func(key string) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(taskURL)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			cfg.RuntimeParams[etlcontext.RunKeySetting] = key
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	runner := etlcontext.Runner{Host: "h", PID: 1, LockMode: "row", Protocol: protocol.Version}
	refused := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.Is(err, etlcontext.ErrStaleRun) && !errors.Is(err, etlcontext.ErrNotFound) && (!errors.As(err, &pgErr) || pgErr.Code != "42501" && pgErr.Code != "DMRUN") {
			t.Errorf("%s: %v, want it refused", what, err)
		}
	}
	lock := func(conn *pgx.Conn, id int64) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err = etlcontext.LockRow(ctx, tx, id, true); err != nil {
			return err
		}
		// A row-mode lock keeps nothing of etl_contexts, which a later
		// migration may alter while the task runs.
		var held int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND relation = 'data_manager.etl_contexts'::regclass`,
			conn.PgConn().PID()).Scan(&held); err != nil || held != 0 {
			t.Errorf("the lock's transaction holds %d locks of etl_contexts (%v), want none", held, err)
		}
		return nil
	}
	// As the task process submits a child: the context, its INITIAL
	// event and its River job, in one statement.
	child := func(conn *pgx.Conn, parent int64) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, _, err := etlcontext.CreateTask(ctx, tx, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 1, ParentID: parent})
			return err
		})
	}
	progress := func(conn *pgx.Conn, id int64, run etlcontext.Run) error {
		_, err := etlcontext.Append(ctx, conn, etlcontext.NewEvent{ContextID: id, Type: "k:PROGRESS", RunID: &run.ID, Payload: map[string]int{"done": 1}})
		return err
	}

	withKey := connectWith(ownRun.Key)
	if _, err := etlcontext.RecordRunner(ctx, withKey, own, ownRun.ID, runner); err != nil {
		t.Errorf("record itself on its own run: %v", err)
	}
	if err := progress(withKey, own, ownRun); err != nil {
		t.Errorf("an event of its own run: %v", err)
	}
	if err := lock(withKey, own); err != nil {
		t.Errorf("lock its own INITIAL event: %v", err)
	}
	if err := child(withKey, own); err != nil {
		t.Errorf("submit a child: %v", err)
	}
	// A member of dama_operator too may do what an operator does, and no
	// more of another run's rows.
	operating := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, env.NewLogin(sql.RoleTask, sql.RoleOperator))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}()
	for name, conn := range map[string]*pgx.Conn{"with another run's key": withKey, "without a key": connectWith(""), "as an operator too": operating} {
		_, err := etlcontext.RecordRunner(ctx, conn, other, otherRun.ID, runner)
		refused("record itself on another run "+name, err)
		refused("an event of another run "+name, progress(conn, other, otherRun))
		refused("lock another run's INITIAL event "+name, lock(conn, other))
		if conn != operating { // an operator submits what it likes
			refused("submit a child of another run "+name, child(conn, other))
		}
		for what, stmt := range map[string]string{
			"submit a task of its own":                   `INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts) VALUES ('k', 'q', 1)`,
			"take another task's key for a child":        `INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts, idempotency_key) VALUES (` + ownID + `, 'k', 'q', 1, 'dama:child:` + otherID + `:x')`,
			"submit a child that runs already":           `INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts, etl_status) VALUES (` + ownID + `, 'k', 'q', 1, 'RUNNING')`,
			"submit a child with an id of its choice":    `INSERT INTO data_manager.etl_contexts (etl_context_id, parent_context_id, kind, queue, max_attempts) VALUES (1000, ` + ownID + `, 'k', 'q', 1)`,
			"record itself on another run by SQL":        `UPDATE data_manager.etl_contexts SET pid = 7 WHERE etl_context_id = ` + otherID,
			"move its own task to another River job":     `UPDATE data_manager.etl_contexts SET river_job_id = 424242 WHERE etl_context_id = ` + ownID,
			"rename River's jobs":                        `UPDATE river_job SET kind = 'other'`,
			"insert a River job for another task":        `INSERT INTO river_job (args, kind, max_attempts, queue, state) VALUES ('{"etl_context_id": ` + otherID + `}', 'dama_task', 1, 'q', 'available')`,
			"insert a River job that runs already":       `INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt) VALUES ('{"etl_context_id": ` + ownID + `}', 'dama_task', 1, 'q', 'running', 1)`,
			"ask for its own task's cancellation":        `INSERT INTO data_manager.event_store (etl_context_id, type, run_id) VALUES (` + ownID + `, 'k:CANCEL_REQUESTED', '` + ownRun.ID + `')`,
			"retry its own task":                         `INSERT INTO data_manager.event_store (etl_context_id, type, run_id) VALUES (` + ownID + `, 'k:RETRIED', '` + ownRun.ID + `')`,
			"lock an INITIAL event without the function": `SELECT 1 FROM data_manager.event_store WHERE etl_context_id = ` + otherID + ` FOR UPDATE`,
			"take an event id a later event draws":       `INSERT INTO data_manager.event_store (event_id, etl_context_id, type, run_id) OVERRIDING SYSTEM VALUE VALUES (1000000, ` + ownID + `, 'k:PROGRESS', '` + ownRun.ID + `')`,
			"take a job id a later job draws":            `INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts) VALUES (` + ownID + `, 'k', 'q', 1); INSERT INTO river_job (id, args, kind, max_attempts, queue, state) SELECT 1000000, jsonb_build_object('etl_context_id', max(etl_context_id)), 'dama_task', 1, 'q', 'available' FROM data_manager.etl_contexts WHERE parent_context_id = ` + ownID,
			"give its child a job not its own":           `INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts) VALUES (` + ownID + `, 'k', 'q', 1); UPDATE data_manager.etl_contexts SET river_job_id = 1000000 WHERE parent_context_id = ` + ownID + ` AND river_job_id IS NULL`,
		} {
			if conn == operating && slices.Contains([]string{"submit a task of its own", "ask for its own task's cancellation", "retry its own task"}, what) {
				continue // what an operator does
			}
			_, err := conn.Exec(ctx, stmt)
			refused(what+" "+name, err)
		}
	}
	var pid *int
	if err := env.Pool.QueryRow(ctx, `SELECT pid FROM data_manager.etl_contexts WHERE etl_context_id = $1`, other).Scan(&pid); err != nil || pid != nil {
		t.Errorf("the other run's pid: %v, %v; want none recorded", pid, err)
	}
	// Its outcome, written again after a lost reply, is the one stored,
	// though the run is over by then.
	seq := 1
	final := etlcontext.NewEvent{ContextID: own, Type: "k:FINAL", RunID: &ownRun.ID, Seq: &seq, Payload: map[string]int{}}
	for try := range 2 {
		if _, err := etlcontext.Append(ctx, withKey, final); err != nil {
			t.Errorf("its outcome, try %d: %v", try+1, err)
		}
	}
}

// Another program's River client, sharing River's tables with rights on
// them alone, still inserts its jobs: the check on River's table asks who
// writes of pg_catalog alone.
func TestAnotherProgramsRiverClientStillInserts(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	login := env.NewLogin()
	u, err := url.Parse(login)
	if err != nil {
		t.Fatal(err)
	}
	role := pgx.Identifier{u.User.Username()}.Sanitize()
	for _, q := range []string{
		`GRANT SELECT, INSERT ON river_job TO ` + role,
		`GRANT USAGE ON SEQUENCE river_job_id_seq TO ` + role,
	} {
		if _, err := env.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, login)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'another_program', 1, 'q', 'available')`); err != nil {
		t.Errorf("a River job of another program's: %v", err)
	}
}
