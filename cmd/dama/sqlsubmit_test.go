package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlSubmitConfig has two queues, so that a submission can name the one
// its kind is not in.
const sqlSubmitConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 4 }
  other: { max_running: 1 }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 2
    children: [regional]
  regional:
    queue: etl
    command: ["{{sample}}"]
    concurrency_key: source.region
`

// psql runs sql with psql as the login of url and returns what it printed
// (unaligned, tuples only), what it said on stderr, and its exit code.
func psql(t *testing.T, url, sql string) (stdout, stderr string, code int) {
	t.Helper()
	bin, err := testenv.PGBin("psql")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errOut.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("psql: %v", err)
	}
	return strings.TrimSpace(out.String()), errOut.String(), 0
}

// pythonWithPsycopg2 returns a Python 3 that imports psycopg2: Debian's
// (python3-psycopg2, which scripts/test.sh installs) before any other on
// PATH. Without one the test is skipped, unless DAMA_TEST_PYTHON=required
// (scripts/test.sh).
func pythonWithPsycopg2(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import psycopg2").Run() == nil {
			return p
		}
	}
	if os.Getenv("DAMA_TEST_PYTHON") == "required" {
		t.Fatal("no python3 with psycopg2 found, and DAMA_TEST_PYTHON=required")
	}
	t.Skip("no python3 with psycopg2: scripts/test.sh installs Debian's python3-psycopg2")
	return ""
}

// Each supervisor publishes its kinds at its start, and any program that
// reaches the database submits tasks of them with data_manager.submit, in
// its own transaction: psql and a Python program here, as an operator.
// Its options (idempotency key, queue, run-at, parent) do what dama
// submit's do; a kind no supervisor published, a queue none serves, a key
// of dama's and a reader are refused.
func TestSubmitFromSQL(t *testing.T) { testenv.LockModes(t, testSubmitFromSQL) }

func testSubmitFromSQL(t *testing.T) {
	env := testenv.New(t)
	cfg := env.WriteConfig(sqlSubmitConfig)
	w := &world{Env: env, cfg: cfg}
	env.StartWith(cfg, []string{"DATABASE_URL=" + env.NewLogin(sql.RoleSupervisor)}, nil, "supervisor")
	ctx := context.Background()
	testenv.Eventually(t, 30*time.Second, "the supervisor to publish its kinds", func() (bool, error) {
		var n int
		err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.kinds WHERE kind IN ('sample', 'regional')`).Scan(&n)
		return n == 2, err
	})
	var queue string
	var attempts int
	var command []string
	if err := env.Pool.QueryRow(ctx, `SELECT queue, max_attempts, settings->'command' FROM data_manager.kinds WHERE kind = 'sample'`).
		Scan(&queue, &attempts, &command); err != nil || queue != "etl" || attempts != 2 || len(command) != 1 || command[0] != env.SampleETL {
		t.Errorf("published kind sample: queue %q, max_attempts %d, command %q (%v); want etl, 2, [%s]", queue, attempts, command, err, env.SampleETL)
	}

	op := env.NewLogin(sql.RoleOperator)
	exists := func(id string) bool {
		t.Helper()
		var n int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// Rolled back with the caller's transaction.
	out, stderr, code := psql(t, op, `BEGIN; SELECT data_manager.submit('sample', '{"steps": 1}'); ROLLBACK;`)
	if code != 0 || out == "" || exists(out) {
		t.Errorf("a submission rolled back: %q, exit %d, %s; want an id that does not exist", out, code, stderr)
	}
	// Once per key, and run.
	first, stderr, code := psql(t, op, `SELECT data_manager.submit('sample', '{"steps": 2, "step_ms": 10}', idempotency_key => 'psql-1')`)
	again, _, _ := psql(t, op, `SELECT data_manager.submit('sample', '{"steps": 2, "step_ms": 10}', idempotency_key => 'psql-1')`)
	if code != 0 || first == "" || again != first {
		t.Fatalf("submit twice with one key: %q then %q, exit %d, %s; want one id", first, again, code, stderr)
	}
	parent := testenv.Atoi(t, first)
	if got := w.waitSettled(parent, time.Minute); got.Status != etlcontext.StatusDone || got.Queue != "etl" {
		t.Errorf("the task submitted from psql: %s in queue %s, want DONE in etl", got.Status, got.Queue)
	}
	// Into another queue a supervisor serves, and run there.
	elsewhere, stderr, code := psql(t, op, `SELECT data_manager.submit('sample', queue => 'other')`)
	if code != 0 {
		t.Fatalf("submit into queue other: exit %d, %s", code, stderr)
	}
	if got := w.waitSettled(testenv.Atoi(t, elsewhere), time.Minute); got.Status != etlcontext.StatusDone || got.Queue != "other" {
		t.Errorf("the task submitted into queue other: %s in queue %s, want DONE in other", got.Status, got.Queue)
	}
	// A child, due in an hour.
	later, stderr, code := psql(t, op, `SELECT data_manager.submit('regional', '{"source": {"region": "eu"}}', run_at => now() + interval '1 hour', parent => `+first+`)`)
	if code != 0 {
		t.Fatalf("submit a child due in an hour: exit %d, %s", code, stderr)
	}
	var parentOf *int64
	var key *string
	var due bool
	var jobState string
	if err := env.Pool.QueryRow(ctx, `
		SELECT c.parent_context_id, c.concurrency_key, c.due_at > now() + interval '50 minutes', j.state
		  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_context_id = $1`, later).Scan(&parentOf, &key, &due, &jobState); err != nil {
		t.Fatal(err)
	}
	if parentOf == nil || *parentOf != parent || key == nil || *key != "eu" || !due || jobState != "scheduled" {
		t.Errorf("the child due in an hour: parent %v, concurrency key %v, due in an hour %v, job %s; want %d, eu, true, scheduled",
			parentOf, key, due, jobState, parent)
	}
	if got := w.task(testenv.Atoi(t, later)); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
		t.Errorf("the child due in an hour: %s at attempt %d, want QUEUED, not started", got.Status, got.Attempt)
	}

	// Refused, each with one line that says why, and nothing made.
	before := countTasks(t, env)
	for stmt, want := range map[string]string{
		`SELECT data_manager.submit('nope')`:                                                    "unknown kind 'nope': no supervisor has published it (data_manager.kinds has regional, sample)",
		`SELECT data_manager.submit('sample', queue => 'nowhere')`:                              "queue 'nowhere': the supervisor that published kind sample serves etl, other",
		`SELECT data_manager.submit('sample', idempotency_key => 'dama:child:1:x')`:             `idempotency keys starting with "dama:" are dama's own`,
		`SELECT data_manager.submit('regional', '{"source": {}}')`:                              "the arguments have no field source.region, the kind's concurrency_key",
		`SELECT data_manager.submit('sample', parent => 999999)`:                                "parent task 999999 does not exist",
		`SELECT data_manager.submit('regional', '{"source": {"region": "eu"}}', 'psql-1')`:      "idempotency key belongs to a task of another kind: \"psql-1\" is the key of task " + first + ", of kind sample",
		`SELECT data_manager.submit('sample', jsonb_build_object('blob', repeat('x', 100000)))`: "arguments are 100012 bytes as stored; a task receives them in DAMA_ARGS, which holds at most 98304",
		`SELECT data_manager.submit('sample', '42')`:                                            "arguments must be a JSON object, not number",
		`SELECT data_manager.submit('sample', 'null')`:                                          "arguments must be a JSON object, not null",
	} {
		if out, stderr, code := psql(t, op, stmt); code == 0 || !strings.Contains(stderr, "ERROR:  "+want+"\n") {
			t.Errorf("%s: %q, exit %d, stderr %q; want refused with %q", stmt, out, code, stderr, want)
		}
	}
	// Only those who may submit: a reader may not, nor a task process's role.
	for role, url := range map[string]string{sql.RoleReader: env.NewLogin(sql.RoleReader), sql.RoleTask: env.NewLogin(sql.RoleTask)} {
		if out, stderr, code := psql(t, url, `SELECT data_manager.submit('sample')`); code == 0 || !strings.Contains(stderr, "permission denied for function submit") {
			t.Errorf("submit as a member of %s: %q, exit %d, %s; want permission denied", role, out, code, stderr)
		}
	}
	if after := countTasks(t, env); after != before {
		t.Errorf("%d tasks after the refused submissions, want %d", after, before)
	}

	// From Python, in the program's own transactions.
	python := pythonWithPsycopg2(t)
	script := filepath.Join(env.Dir, "submit.py")
	if err := os.WriteFile(script, []byte(pythonSubmit), 0o644); err != nil {
		t.Fatal(err)
	}
	pout := runProgram(t, []string{"DATABASE_URL=" + op}, python, script)
	var res struct {
		RolledBack int64    `json:"rolled_back"`
		Submitted  []int64  `json:"submitted"`
		Unknown    []string `json:"unknown"`
	}
	if err := json.Unmarshal(pout, &res); err != nil {
		t.Fatalf("python printed %q: %v", pout, err)
	}
	if exists(strconv.FormatInt(res.RolledBack, 10)) {
		t.Errorf("python's rolled-back submission %d exists", res.RolledBack)
	}
	if len(res.Unknown) != 2 || res.Unknown[0] != "DMKND" {
		t.Errorf("python's submission of an unknown kind: %q, want SQLSTATE DMKND", res.Unknown)
	}
	if len(res.Submitted) != 2 {
		t.Fatalf("python submitted %v, want two tasks", res.Submitted)
	}
	for _, id := range res.Submitted {
		if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
			t.Errorf("task %d submitted from python: %s, want DONE", id, got.Status)
		}
	}
}

// pythonSubmit submits from Python as a data team's program would: two
// tasks committed together, one rolled back, and a kind that does not
// exist. It prints what happened as JSON.
const pythonSubmit = `import json, os
import psycopg2

conn = psycopg2.connect(os.environ["DATABASE_URL"])
submit = "SELECT data_manager.submit(%s, %s::jsonb, idempotency_key => %s)"
with conn.cursor() as cur:
    cur.execute(submit, ("sample", json.dumps({"steps": 1}), None))
    rolled_back = cur.fetchone()[0]
conn.rollback()
submitted = []
with conn:  # one transaction: both tasks, or neither
    with conn.cursor() as cur:
        for day in ("2026-11-01", "2026-11-02"):
            cur.execute(submit, ("regional", json.dumps({"day": day, "source": {"region": "eu"}}), "load-" + day))
            submitted.append(cur.fetchone()[0])
unknown = None
try:
    with conn, conn.cursor() as cur:
        cur.execute(submit, ("nope", "{}", None))
except psycopg2.Error as e:
    unknown = [e.pgcode, e.diag.message_primary]
print(json.dumps({"rolled_back": rolled_back, "submitted": submitted, "unknown": unknown}))
`

// runProgram runs args with the test's environment and environ added,
// bounded by a minute, and returns its stdout; it fails t, with its
// stderr, when it fails.
func runProgram(t *testing.T, environ []string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), environ...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return out
}

// countTasks is how many contexts the database holds.
func countTasks(t *testing.T, env *testenv.Env) int {
	t.Helper()
	var n int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_contexts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The submission examples of docs/tasks.md (docs/examples) run as written:
// submit.py inserts a row of its own and submits its import in one
// transaction, submit.sh submits an import once however often it runs, and
// the tasks are DONE.
func TestTheSubmitExamplesRun(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  import_file: { command: ["{{sample}}"] }
`)
	w := &world{Env: env, cfg: cfg}
	env.Start(cfg, "supervisor")
	ctx := context.Background()
	op := env.NewLogin(sql.RoleOperator)
	login, err := pgconn.ParseConfig(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, `
		CREATE TABLE imports (id serial PRIMARY KEY, file text NOT NULL);
		GRANT SELECT, INSERT ON imports TO `+login.User+`;
		GRANT USAGE ON SEQUENCE imports_id_seq TO `+login.User); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the supervisor to publish its kinds", func() (bool, error) {
		var n int
		err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.kinds WHERE kind = 'import_file'`).Scan(&n)
		return n == 1, err
	})
	examples, err := filepath.Abs(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	psqlBin, err := testenv.PGBin("psql")
	if err != nil {
		t.Fatal(err)
	}
	run := func(environ []string, args ...string) int64 {
		t.Helper()
		return testenv.Atoi(t, strings.TrimSpace(string(runProgram(t, environ, args...))))
	}

	py := run([]string{"ETL_DATABASE_URL=" + op}, pythonWithPsycopg2(t), filepath.Join(examples, "submit.py"))
	var file string
	if err := env.Pool.QueryRow(ctx, `
		SELECT i.file FROM imports AS i JOIN data_manager.event_store AS e ON (e.payload->>'import')::int = i.id
		 WHERE e.etl_context_id = $1 AND e.type = 'import_file:INITIAL'`, py).Scan(&file); err != nil || file != "a.csv" {
		t.Errorf("submit.py's task %d names import %q (%v), want the row of a.csv it inserted", py, file, err)
	}

	pgEnv := []string{"PATH=" + filepath.Dir(psqlBin) + ":" + os.Getenv("PATH"),
		"PGHOST=" + login.Host, "PGPORT=" + strconv.Itoa(int(login.Port)), "PGUSER=" + login.User, "PGDATABASE=" + login.Database}
	sh := run(pgEnv, filepath.Join(examples, "submit.sh"), "b'; DROP TABLE imports; --.csv")
	if again := run(pgEnv, filepath.Join(examples, "submit.sh"), "b'; DROP TABLE imports; --.csv"); again != sh {
		t.Errorf("submit.sh of one file twice: tasks %d and %d, want one", sh, again)
	}
	args, err := etlcontext.LatestPayload(ctx, env.Pool, sh, "INITIAL")
	if err != nil || !strings.Contains(string(args), `"b'; DROP TABLE imports; --.csv"`) {
		t.Errorf("submit.sh's task's arguments: %s (%v), want the file name as given", args, err)
	}
	for _, id := range []int64{py, sh} {
		if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
			t.Errorf("task %d: %s, want DONE", id, got.Status)
		}
	}
}
