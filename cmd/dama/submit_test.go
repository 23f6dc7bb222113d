package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	a := w.Dama(w.cfg, "submit", "sample", "--idempotency-key", "nightly-2026-11-21")
	b := w.Dama(w.cfg, "submit", "sample", "--idempotency-key", "nightly-2026-11-21", "--args", `{"steps": 99}`)
	if a.Code != 0 || b.Code != 0 || a.Stdout != b.Stdout {
		t.Fatalf("two submissions with one key: %q (%d) and %q (%d)", a.Stdout, a.Code, b.Stdout, b.Code)
	}
	var contexts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	if contexts != 1 || jobs != 1 {
		t.Errorf("%d contexts and %d jobs, want 1 and 1", contexts, jobs)
	}

	parent := testenv.Atoi(t, a.Stdout)
	// As a supervisor whose sample kind names sample in children: would
	// have published it (migration 33).
	if _, err := etlcontext.PublishKinds(context.Background(), w.Pool, []etlcontext.PublishedKind{{Kind: "sample", Queue: "default", MaxAttempts: 3, Children: []string{"sample"}, PublishedBy: "test", Release: "test"}}); err != nil {
		t.Fatal(err)
	}
	child := w.Dama(w.cfg, "submit", "sample", "--parent", strconv.FormatInt(parent, 10))
	if child.Code != 0 {
		t.Fatalf("submit a child: %s", child.Stderr)
	}
	if got := w.task(testenv.Atoi(t, child.Stdout)); got.ParentID == nil || *got.ParentID != parent {
		t.Errorf("child's parent_context_id %v, want %d", deref(got.ParentID), parent)
	}

	var listed []etlcontext.Task
	res := w.Dama(w.cfg, "status", "--json", "--status", "queued", "--limit", "1")
	if err := json.Unmarshal([]byte(res.Stdout), &listed); err != nil || len(listed) != 1 || listed[0].ID != testenv.Atoi(t, child.Stdout) {
		t.Errorf("status --status queued --limit 1: %v %+v (stderr %s), want the newest task alone", err, listed, res.Stderr)
	}
	res = w.Dama(w.cfg, "status", "--json", "--status", "done")
	if err := json.Unmarshal([]byte(res.Stdout), &listed); err != nil || len(listed) != 0 {
		t.Errorf("status --status done: %v %+v, want none", err, listed)
	}
}

// A key names one submission of one kind: reusing it with another kind is an
// error, not the other kind's task, and keys starting with dama: are dama's
// own (schedule ticks, children).
func TestIdempotencyKeyOfAnotherKindOrDamasOwnIsRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	cfg := w.WriteConfig(sampleConfigFor(10) + `
  other:
    queue: etl
    command: ["{{sample}}"]
`)
	first := w.Dama(cfg, "submit", "sample", "--idempotency-key", "K")
	if first.Code != 0 {
		t.Fatalf("submit: exit %d: %s", first.Code, first.Stderr)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"another kind", []string{"submit", "other", "--idempotency-key", "K"},
			`dama: submit other task: idempotency key belongs to a task of another kind: "K" is the key of task ` + strings.TrimSpace(first.Stdout) + `, of kind sample`},
		{"a child's key", []string{"submit", "sample", "--idempotency-key", "dama:child:" + strings.TrimSpace(first.Stdout) + ":part-1"},
			`dama: submit sample task: idempotency key "dama:child:` + strings.TrimSpace(first.Stdout) + `:part-1": idempotency keys starting with "dama:" are reserved for dama's own submissions`},
		{"a tick's key", []string{"submit", "sample", "--idempotency-key", "dama:schedule:sample:2026-11-21T02:00:00Z"}, `are reserved for dama's own submissions`},
		{"bare prefix", []string{"submit", "sample", "--idempotency-key", "dama:"}, `are reserved for dama's own submissions`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := w.Dama(cfg, c.args...)
			lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
			if res.Code != 1 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || res.Stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want 1, nothing on stdout, one line with %q", res.Code, res.Stdout, res.Stderr, c.want)
			}
		})
	}
	if again := w.Dama(cfg, "submit", "sample", "--idempotency-key", "K"); again.Code != 0 || again.Stdout != first.Stdout {
		t.Errorf("same kind again: exit %d, stdout %q, stderr %q; want 0 and %q", again.Code, again.Stdout, again.Stderr, first.Stdout)
	}
	var contexts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	if contexts != 1 || jobs != 1 {
		t.Errorf("%d contexts and %d jobs, want 1 and 1", contexts, jobs)
	}
}

func TestBadInputIsOneLineAndWritesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	unreachable := *w.Env
	unreachable.URL = "postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=2"
	misspelt := *w.Env
	misspelt.URL = "postgress://nobody:secret@127.0.0.1:1/none"
	keywords := *w.Env
	keywords.URL = "password=secret://x host"
	cases := []struct {
		name string
		env  *testenv.Env
		cfg  string
		args []string
		want string
	}{
		{"unknown kind", w.Env, w.cfg, []string{"submit", "nope"}, "unknown kind"},
		{"malformed JSON", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"password": secret`}, `--args: want a JSON object, as '{"region": "eu"}'; not JSON at byte 14`},
		{"arguments not an object", w.Env, w.cfg, []string{"submit", "sample", "--args", "42"}, "--args: want a JSON object, as '{\"region\": \"eu\"}'; got a number"},
		{"null arguments", w.Env, w.cfg, []string{"submit", "sample", "--args", "null"}, "got null"},
		{"an array", w.Env, w.cfg, []string{"submit", "sample", "--args", "[1]"}, "got an array"},
		{"two values", w.Env, w.cfg, []string{"submit", "sample", "--args", "{} {}"}, "more than one JSON value"},
		{"scheme-like keyword", &keywords, w.cfg, []string{"submit", "sample"}, "DATABASE_URL: cannot parse"},
		{"no kind", w.Env, w.cfg, []string{"submit"}, "name one kind to submit: sample"},
		{"missing config", w.Env, "", []string{"submit", "sample"}, "no configuration file"},
		{"config not found", w.Env, filepath.Join(w.Dir, "absent.yaml"), []string{"submit", "sample"}, "DAMA_CONFIG=" + filepath.Join(w.Dir, "absent.yaml") + ": no such file"},
		{"unreachable database", &unreachable, w.cfg, []string{"submit", "sample"}, "connect to database none on 127.0.0.1:1 as nobody: connection refused"},
		{"misspelt scheme", &misspelt, w.cfg, []string{"submit", "sample"}, `DATABASE_URL's scheme "postgress" is not postgres:// or postgresql://`},
		{"bad id", w.Env, w.cfg, []string{"status", "x"}, "invalid task id"},
		{"unknown id", w.Env, w.cfg, []string{"events", "12345"}, "not found"},
		{"unknown flag", w.Env, w.cfg, []string{"submit", "sample", "--nope"}, "unknown flag"},
		{"unknown parent", w.Env, w.cfg, []string{"submit", "sample", "--parent", "999"}, "parent task 999 does not exist"},
		{"negative delay", w.Env, w.cfg, []string{"submit", "sample", "--delay", "-1s"}, "must not be negative"},
		{"a number read back far longer", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"n": 1e70}`}, "write them in full, or as strings"},
		{"NUL in arguments", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"s": "a\u0000b"}`}, "cannot store"},
		{"arguments too large", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"blob": "` + strings.Repeat("x", 100<<10) + `"}`}, "DAMA_ARGS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := c.env.Dama(c.cfg, c.args...)
			lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
			if res.Code == 0 || len(lines) != 1 || strings.Count(lines[0], c.want) != 1 || strings.Contains(res.Stderr, "secret") || res.Stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want non-zero, nothing on stdout, one line mentioning %q once, and no password", res.Code, res.Stdout, res.Stderr, c.want)
			}
		})
	}
	var contexts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	if contexts != 0 || jobs != 0 {
		t.Errorf("bad input wrote %d contexts and %d jobs", contexts, jobs)
	}
}

func TestDelayedSubmission(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	res := w.Dama(w.cfg, "submit", "sample", "--delay", "3s", "--args", `{"steps": 1, "step_ms": 1}`)
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	var delay float64
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT extract(epoch FROM j.scheduled_at - c.created_at)
		  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_context_id = $1`, id).Scan(&delay); err != nil {
		t.Fatal(err)
	}
	if delay < 2.5 {
		t.Fatalf("job scheduled %.2fs after submission, want about 3s", delay)
	}
	got := w.waitSettled(id, 30*time.Second)
	if got.Status != etlcontext.StatusDone || got.StartedAt.Sub(got.CreatedAt) < 2500*time.Millisecond {
		t.Errorf("%s, started %s after submission; want DONE, started no earlier than the delay", got.Status, got.StartedAt.Sub(got.CreatedAt))
	}
}

// --run-at holds a task QUEUED until its time, shown as due in the view and
// dama status; bad times are refused in one line.
func TestRunAt(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	for _, args := range [][]string{
		{"submit", "sample", "--run-at", "tomorrow"},
		{"submit", "sample", "--run-at", time.Now().Add(time.Hour).Format(time.RFC3339), "--delay", "1m"},
	} {
		if res := w.Dama(w.cfg, args...); res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 {
			t.Errorf("dama %v: exit %d, stderr %q; want one line and a failure", args, res.Code, res.Stderr)
		}
	}
	if tasks, err := etlcontext.Tasks(context.Background(), w.Pool, etlcontext.TaskQuery{}); err != nil || len(tasks) != 0 {
		t.Fatalf("a refused submit wrote %d tasks (%v)", len(tasks), err)
	}
	w.Start(w.cfg, "supervisor")
	// Shown as due while it waits: an hour ahead, so that it still waits
	// when dama status looks, however slow the machine.
	due := time.Now().Add(time.Hour).Truncate(time.Second)
	res := w.Dama(w.cfg, "submit", "sample", "--run-at", due.Format(time.RFC3339), "--args", `{"steps": 1, "step_ms": 1}`)
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	task := w.task(id)
	if task.Status != etlcontext.StatusQueued || task.DueAt == nil || !task.DueAt.Equal(due) {
		t.Fatalf("%s due %v, want QUEUED due %s", task.Status, deref(task.DueAt), due)
	}
	if out := w.Dama(w.cfg, "status", "-o", "wide", fmt.Sprint(id)).Stdout; !strings.Contains(out, "until "+due.Local().Format(time.DateTime)) {
		t.Errorf("dama status does not say when the task is due:\n%s", out)
	}
	var scheduled int
	if err := w.Pool.QueryRow(context.Background(), `SELECT scheduled FROM data_manager.dama_queue_stats WHERE kind = 'sample'`).Scan(&scheduled); err != nil || scheduled != 1 {
		t.Errorf("dama_queue_stats: %d scheduled (%v), want 1", scheduled, err)
	}
	// Run at its time, not before: a task due a few seconds ahead, whose
	// due time has not passed once it is submitted (a slow submit leaves
	// nothing to tell, so it is tried again further ahead).
	for lead := 5 * time.Second; ; lead *= 2 {
		began := time.Now()
		soon := began.Add(lead).Truncate(time.Second)
		res = w.Dama(w.cfg, "submit", "sample", "--run-at", soon.Format(time.RFC3339), "--args", `{"steps": 1, "step_ms": 1}`)
		if res.Code != 0 {
			t.Fatalf("submit: %s", res.Stderr)
		}
		if !time.Now().Before(soon) {
			t.Logf("dama submit took %s, past the due time %s; again, %s ahead", time.Since(began).Round(time.Millisecond), soon, 2*lead)
			if lead > time.Minute {
				t.Fatal("dama submit took longer than the task's lead, every time")
			}
			continue
		}
		got := w.waitSettled(testenv.Atoi(t, res.Stdout), lead+30*time.Second)
		if got.Status != etlcontext.StatusDone || got.StartedAt.Before(soon) {
			t.Errorf("%s, started at %s; want DONE, started no earlier than %s", got.Status, got.StartedAt, soon)
		}
		break
	}
	if task := w.task(id); task.Status != etlcontext.StatusQueued {
		t.Errorf("the task due in an hour is %s, want QUEUED", task.Status)
	}
}

// pgx's default sslmode, prefer, tries a server without TLS twice: the
// user reads the server's answer once, without the first refusal.
func TestAConnectionErrorSaysTheServersAnswerOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.NewServer(t)
	e := testenv.NewOn(t, srv)
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawQuery = "/dama_no_such_database", ""
	missing := *e
	missing.URL = u.String()
	res := missing.Dama("", "status")
	want := "dama: connect to database dama_no_such_database on " + u.Host +
		` as postgres: database "dama_no_such_database" does not exist (SQLSTATE 3D000)` + "\n"
	if res.Code == 0 || res.Stderr != want {
		t.Errorf("status with a missing database: exit %d, stderr %q; want %q", res.Code, res.Stderr, want)
	}
	// Each attempt is refused alike.
	missing.URL = "postgres://nobody:secret@127.0.0.1:1/none"
	res = missing.Dama("", "status")
	if want := "dama: connect to database none on 127.0.0.1:1 as nobody: connection refused\n"; res.Code == 0 || res.Stderr != want {
		t.Errorf("status with nothing listening: exit %d, stderr %q; want %q", res.Code, res.Stderr, want)
	}
}
