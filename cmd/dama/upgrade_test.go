package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/version"
)

// Both lock modes, whatever DAMA_TEST_LOCK_MODE says: the previous
// release's task processes of each must survive the upgrade.
const upgradeConfig = `
lock_mode: row
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
kill_grace: 1s
queues:
  etl: { max_running: 20 }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 3
  sample_advisory:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 3
    lock_mode: advisory
`

// upgradeTask is what the test knows of a task across the upgrade.
type upgradeTask struct {
	id  int64
	pid int
}

// The redeploy docs/operations.md describes ("Releases and upgrades"), from the previous release recorded in
// CHANGELOG.md (built from this clone's own history) to this code, with
// tasks of the previous release running throughout.
func TestUpgradeFromThePreviousRelease(t *testing.T) {
	t.Parallel()
	prev := testenv.PreviousRelease(t)
	oldBin := testenv.BuildRelease(t, prev)
	t.Logf("previous release %s (commit %s)", prev.Version, prev.Commit)

	t.Run("the previous release refuses the current schema", func(t *testing.T) {
		env := testenv.New(t)
		old := env.With(oldBin)
		cfg := env.WriteConfigAsIs(upgradeConfig)
		for _, args := range [][]string{{"supervisor"}, {"submit", "sample"}, {"migrate"}} {
			res := old.Dama(cfg, args...)
			lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
			if res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], "schema is newer than this dama") ||
				!strings.Contains(lines[0], "migrated by dama "+version.Release) {
				t.Errorf("%s %v: exit %d, stderr %q; want non-zero and one line naming dama %s", prev.Version, args, res.Code, res.Stderr, version.Release)
			}
		}
		if contexts, jobs := countRows(t, env); contexts != 0 || jobs != 0 {
			t.Errorf("refused commands wrote %d contexts and %d jobs", contexts, jobs)
		}
	})

	t.Run("upgrade", func(t *testing.T) { testUpgrade(t, prev, oldBin) })

	// The redeploy replaces the file a running supervisor started from:
	// it goes on launching task processes of its own release.
	t.Run("a supervisor launches its own release after its file is replaced", func(t *testing.T) {
		w := newWorld(t, 10)
		installed := filepath.Join(w.Dir, "dama")
		install := func(from string) {
			t.Helper()
			data, err := os.ReadFile(from)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(installed+".new", data, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(installed+".new", installed); err != nil {
				t.Fatal(err)
			}
		}
		install(w.DamaBin)
		sup := w.With(installed).Start(w.cfg, "supervisor")
		sup.WaitReady(t, 30*time.Second)
		install(oldBin)
		id := w.submit(1, 1)
		got := w.waitSettled(id, 60*time.Second)
		if got.Status != etlcontext.StatusDone || got.RunnerRelease == nil || *got.RunnerRelease != version.Release {
			t.Errorf("%s, run by a task process of %v; want DONE by one of %s, the supervisor's own", got.Status, deref(got.RunnerRelease), version.Release)
		}
	})
}

func testUpgrade(t *testing.T, prev testenv.Release, oldBin string) {
	env := testenv.NewUnmigrated(t)
	old := env.With(oldBin)
	// The previous release's processes read a configuration it knows; the
	// current one's may name the user a root supervisor's commands run as.
	oldCfg, cfg := env.WriteConfigAsIs(upgradeConfig), env.WriteConfig(upgradeConfig)
	configOf := func(e *testenv.Env) string {
		if e == old {
			return oldCfg
		}
		return cfg
	}
	startsDir := filepath.Join(env.Dir, "starts")
	if err := os.MkdirAll(startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w := &world{Env: env, cfg: cfg, startsDir: startsDir}
	ctx := context.Background()
	// Held tasks run until the test has redeployed under them, however
	// long that takes.
	release := filepath.Join(env.Dir, "release")
	submit := func(e *testenv.Env, kind string, steps int, held bool) int64 {
		t.Helper()
		a := map[string]any{"steps": steps, "step_ms": 100, "starts_dir": startsDir}
		if held {
			a["until_file"] = release
		}
		args, _ := json.Marshal(a)
		res := e.Dama(configOf(e), "submit", kind, "--args", string(args))
		if res.Code != 0 {
			t.Fatalf("submit with %s: exit %d: %s", e.DamaBin, res.Code, res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}
	// The view's columns every release has: the current code's reader
	// needs the current schema.
	runningPID := func(id int64) (int, bool) {
		var (
			pid    *int
			locked bool
		)
		if err := env.Pool.QueryRow(ctx, `
			SELECT pid, initial_event_locked FROM data_manager.dama_task_queue
			 WHERE etl_context_id = $1 AND etl_status = 'RUNNING'`, id).Scan(&pid, &locked); err != nil || pid == nil || !locked {
			return 0, false
		}
		return *pid, true
	}

	// Release N: migrated, a supervisor, and long tasks in both lock modes.
	if res := old.Dama("", "migrate"); res.Code != 0 {
		t.Fatalf("%s migrate: exit %d: %s", prev.Version, res.Code, res.Stderr)
	}
	oldSup := old.Start(oldCfg, "supervisor")
	var long []upgradeTask
	for _, kind := range []string{"sample", "sample", "sample_advisory", "sample_advisory"} {
		long = append(long, upgradeTask{id: submit(old, kind, 50, true)})
	}
	for i := range long {
		testenv.Eventually(t, 30*time.Second, "the previous release's tasks to run", func() (bool, error) {
			pid, ok := runningPID(long[i].id)
			long[i].pid = pid
			return ok, nil
		})
	}

	// N+1's migrate, while N's supervisor and tasks run.
	start := time.Now()
	if res := env.Dama("", "migrate"); res.Code != 0 {
		t.Fatalf("migrate to %s while %s's tasks run: exit %d: %s", version.Release, prev.Version, res.Code, res.Stderr)
	}
	t.Logf("dama migrate took %s with %d tasks of %s running", time.Since(start).Round(time.Millisecond), len(long), prev.Version)

	// N's supervisor alone on the migrated schema: its task processes
	// record themselves under N+1's triggers.
	var late []int64
	for _, kind := range []string{"sample", "sample_advisory"} {
		id := submit(env, kind, 20, true)
		late = append(late, id)
		testenv.Eventually(t, 30*time.Second, "a task launched by the previous release after the migration to run", func() (bool, error) {
			_, ok := runningPID(id)
			return ok, nil
		})
		var release *string
		if err := env.Pool.QueryRow(ctx, `
			SELECT runner_release FROM data_manager.etl_attempts WHERE etl_context_id = $1`, id).Scan(&release); err != nil || release == nil || *release != prev.Version {
			t.Errorf("task %d launched by %s after the migration: attempt recorded with release %v (err %v), want %s", id, prev.Version, deref(release), err, prev.Version)
		}
	}

	// A mixed pair: N's supervisor (started before the migration) and
	// N+1's share the queue while new tasks arrive.
	env.Start(cfg, "supervisor")
	var mixed []int64
	for i := range 8 {
		kind := "sample"
		if i%2 == 1 {
			kind = "sample_advisory"
		}
		mixed = append(mixed, submit(env, kind, 20, false))
	}

	// The redeploy ends: N's supervisor dies hard; N+1's adopts its tasks.
	oldSup.Kill(t, syscall.SIGKILL)
	<-oldSup.Done()
	for _, task := range long {
		if pid, ok := runningPID(task.id); !ok || pid != task.pid {
			t.Fatalf("task %d of %s is no longer running under pid %d when its supervisor is killed: the test would prove no adoption", task.id, prev.Version, task.pid)
		}
	}

	cancelled := long[1].id
	res := env.Dama(cfg, "cancel", strconv.FormatInt(cancelled, 10))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "CANCELLED" {
		t.Fatalf("cancel a task of %s: exit %d, stdout %q, stderr %q", prev.Version, res.Code, res.Stdout, res.Stderr)
	}

	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, task := range long {
		got := w.waitSettled(task.id, 90*time.Second)
		want := etlcontext.StatusDone
		if task.id == cancelled {
			want = etlcontext.StatusCancelled
		}
		if got.Status != want || got.PID == nil || *got.PID != task.pid || got.Attempt != 1 {
			t.Errorf("task %d of %s: %s by pid %v at attempt %d; want %s by its pid %d at attempt 1",
				task.id, prev.Version, got.Status, deref(got.PID), got.Attempt, want, task.pid)
		}
		if got.RunnerRelease == nil || *got.RunnerRelease != prev.Version {
			t.Errorf("task %d: runner release %v, want %s", task.id, deref(got.RunnerRelease), prev.Version)
		}
		if task.id == cancelled {
			testenv.Eventually(t, 10*time.Second, "the cancelled task process to end", func() (bool, error) {
				return !testenv.Alive(task.pid), nil
			})
		}
	}
	for _, id := range append(late, mixed...) {
		if got := w.waitSettled(id, 90*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("task %d submitted during the mixed pair: %s at attempt %d, want DONE at attempt 1", id, got.Status, got.Attempt)
		}
	}

	// Every task started once, wrote its events once, and each attempt is
	// recorded with the release of its task process.
	for _, id := range append(append([]int64{long[0].id, long[2].id, long[3].id}, late...), mixed...) {
		if starts := w.starts(id); len(starts) != 1 {
			t.Errorf("task %d started %d times: %v", id, len(starts), starts)
		}
		var finals, dupes int
		if err := env.Pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE type LIKE '%:FINAL'),
			       count(*) - count(DISTINCT (type, payload::text))
			  FROM data_manager.event_store WHERE etl_context_id = $1`, id).Scan(&finals, &dupes); err != nil {
			t.Fatal(err)
		}
		if finals != 1 || dupes != 0 {
			t.Errorf("task %d: %d FINAL events and %d duplicate events, want 1 and 0", id, finals, dupes)
		}
	}
	var attempts, open, unreleased, cancelledAttempts, done int
	if err := env.Pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE ended_at IS NULL), count(*) FILTER (WHERE runner_release IS NULL),
		       count(*) FILTER (WHERE outcome = 'CANCELLED' AND etl_context_id = $1), count(*) FILTER (WHERE outcome = 'DONE')
		  FROM data_manager.etl_attempts`, cancelled).Scan(&attempts, &open, &unreleased, &cancelledAttempts, &done); err != nil {
		t.Fatal(err)
	}
	if want := len(long) + len(late) + len(mixed); attempts != want || open != 0 || unreleased != 0 || cancelledAttempts != 1 || done != want-1 {
		t.Errorf("etl_attempts: %d rows, %d still open, %d without a release, %d CANCELLED for task %d, %d DONE; want %d, 0, 0, 1, %d",
			attempts, open, unreleased, cancelledAttempts, cancelled, done, want, want-1)
	}
}
