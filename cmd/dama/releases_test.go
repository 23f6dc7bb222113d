package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/version"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	latest, err := sql.Latest()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		res := env.Dama("", args...)
		lines := strings.Split(strings.TrimRight(res.Stdout, "\n"), "\n")
		if res.Code != 0 || len(lines) != 5 {
			t.Fatalf("dama %v: exit %d, stdout %q, stderr %q; want 5 lines", args, res.Code, res.Stdout, res.Stderr)
		}
		want := []string{"dama " + version.Release, "commit ", fmt.Sprintf("protocol %d", protocol.Version), fmt.Sprintf("schema %d", latest), "go go1."}
		for i, w := range want {
			if !strings.HasPrefix(lines[i], w) {
				t.Errorf("dama %v line %d: %q, want it to start with %q", args, i+1, lines[i], w)
			}
		}
		// The test binary is built from this checkout, with its commit.
		if commit := strings.TrimPrefix(lines[1], "commit "); len(commit) < 40 {
			t.Errorf("dama %v: commit %q, want the checkout's", args, commit)
		}
	}
}

// What a later release's `dama migrate` leaves behind, as far as this
// release can tell.
func newerSchema(t *testing.T, env *testenv.Env) {
	t.Helper()
	if _, err := env.Pool.Exec(context.Background(), `
		INSERT INTO data_manager.schema_migrations (version_id, is_applied) VALUES (999, true);
		UPDATE data_manager.compatibility SET migrated_by = 'v9.9.9'`); err != nil {
		t.Fatal(err)
	}
}

// setMinRunnerProtocol is what a later release's migration does once no
// task process of an older protocol runs.
func setMinRunnerProtocol(t *testing.T, env *testenv.Env, min int) {
	t.Helper()
	if _, err := env.Pool.Exec(context.Background(), `
		UPDATE data_manager.compatibility SET min_runner_protocol = $1, migrated_by = 'v9.9.9'`, min); err != nil {
		t.Fatal(err)
	}
}

func countRows(t *testing.T, env *testenv.Env) (contexts, jobs int) {
	t.Helper()
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	return contexts, jobs
}

func TestOlderReleaseRefusesANewerSchema(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	newerSchema(t, w.Env)
	for _, args := range [][]string{{"supervisor"}, {"submit", "sample"}, {"migrate"}, {"status"}, {"cancel", "1"}} {
		res := w.Dama(w.cfg, args...)
		lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
		if res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], "schema is newer than this dama") ||
			!strings.Contains(lines[0], "run dama v9.9.9 or later") {
			t.Errorf("dama %v: exit %d, stderr %q; want non-zero and one line saying to run dama v9.9.9", args, res.Code, res.Stderr)
		}
	}
	if contexts, jobs := countRows(t, w.Env); contexts != 0 || jobs != 0 {
		t.Errorf("refused commands wrote %d contexts and %d jobs", contexts, jobs)
	}
}

func TestRetiredRunnerProtocolIsRefused(t *testing.T) {
	testenv.LockModes(t, testRetiredRunnerProtocolIsRefused)
}

func testRetiredRunnerProtocolIsRefused(t *testing.T) {
	w := newWorld(t, 10)

	// A supervisor whose task processes the database no longer accepts
	// does not start.
	setMinRunnerProtocol(t, w.Env, protocol.Version+1)
	res := w.Dama(w.cfg, "supervisor")
	lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
	if res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], "no longer accepts task processes") || !strings.Contains(lines[0], "run dama v9.9.9 or later") {
		t.Errorf("supervisor: exit %d, stderr %q; want non-zero and one line saying to run dama v9.9.9", res.Code, res.Stderr)
	}

	// One that was running when the database retired its protocol stops
	// at its first launch, which its task process refuses, spending no
	// attempt.
	setMinRunnerProtocol(t, w.Env, protocol.Version)
	sup := w.Start(w.cfg, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	setMinRunnerProtocol(t, w.Env, protocol.Version+1)
	id := w.submit(1, 1)
	select {
	case <-sup.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("the supervisor still runs 60s after its task process was refused")
	}
	out, _ := os.ReadFile(sup.Log)
	if sup.Wait() == nil || !strings.Contains(string(out), "dama: the database no longer accepts task processes of this protocol") ||
		!strings.Contains(string(out), "exit_code="+strconv.Itoa(protocol.ExitRefused)) {
		t.Errorf("supervisor exited with %v; want an error after its task process exited %d; log:\n%s", sup.Wait(), protocol.ExitRefused, out)
	}
	runnerLog, _ := os.ReadFile(filepath.Join(w.Dir, "logs", strconv.FormatInt(id, 10)+".log"))
	if n := strings.Count(string(runnerLog), "no longer accepts task processes"); n != 1 {
		t.Errorf("the refused task process said so in %d lines, want 1:\n%s", n, runnerLog)
	}
	got := w.task(id)
	var events int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1`, id).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if got.Status != etlcontext.StatusQueued || got.Attempt != 0 || got.PID != nil || events != 1 {
		t.Errorf("refused task: %s, attempt %d, pid %v, %d events; want QUEUED, attempt 0, no pid, only its INITIAL event",
			got.Status, got.Attempt, deref(got.PID), events)
	}

	// A supervisor of a release the database accepts runs it, once.
	setMinRunnerProtocol(t, w.Env, protocol.Version)
	w.Start(w.cfg, "supervisor")
	got = w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s at attempt %d, want DONE at attempt 1", got.Status, got.Attempt)
	}
	if got.RunnerRelease == nil || *got.RunnerRelease != version.Release || got.RunnerProtocol == nil || *got.RunnerProtocol != protocol.Version || got.LockMode == nil {
		t.Errorf("runner release %v, protocol %v, lock mode %v; want %s, %d and the mode", deref(got.RunnerRelease), deref(got.RunnerProtocol), deref(got.LockMode), version.Release, protocol.Version)
	}
}

// A later release may add a column to etl_contexts while task processes of
// this one run, in either lock mode (docs/operations.md "Releases and upgrades"): a
// row-mode task's lock transaction holds no lock on etl_contexts.
func TestContextsCanGainAColumnWhileTasksRun(t *testing.T) {
	testenv.LockModes(t, testContextsCanGainAColumnWhileTasksRun)
}

func testContextsCanGainAColumnWhileTasksRun(t *testing.T) {
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	id := w.submit(60, 100)
	running := w.waitRunning(id)

	ctx := context.Background()
	conn, err := w.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET lock_timeout = '5s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE data_manager.etl_contexts ADD COLUMN added_by_a_later_release integer`); err != nil {
		t.Fatalf("add a column to etl_contexts while a task runs: %v", err)
	}
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || *got.PID != *running.PID || len(w.starts(id)) != 1 {
		t.Errorf("%s by pid %v after %d starts; want DONE by pid %d, started once", got.Status, deref(got.PID), len(w.starts(id)), *running.PID)
	}
}
