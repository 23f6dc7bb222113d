package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestPostgresRestartKillsNoTask(t *testing.T) {
	testenv.LockModes(t, testPostgresRestartKillsNoTask)
}

func testPostgresRestartKillsNoTask(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	// reconnect_grace is above the slowest restart seen on this kind of
	// machine under the suite's own load (pg_ctl took 11–35 s with the CPU
	// halved): what is proved is that a restart within the grace kills no
	// task, not how fast pg_ctl is. The outage is measured, and compared.
	const grace = 60 * time.Second
	// Every progress line is stored (progress_interval 1ms): none may be
	// stored twice through the outage.
	w := &world{Env: env, cfg: env.WriteConfig(strings.NewReplacer("kill_grace: 1s", fmt.Sprintf("kill_grace: 1s\nreconnect_grace: %s", grace), "progress_interval: 100ms", "progress_interval: 1ms").Replace(sampleConfigFor(10))),
		startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The commands finish once the test has seen the outage through,
	// however long it took.
	submit := func(steps int) int64 { return w.submitHeld(steps, 100) }
	w.Start(w.cfg, "supervisor")
	var ids []int64
	for range 4 {
		// Progress and a checkpoint every 100ms for 30s, then a wait for
		// the release: the commands run through the whole outage.
		ids = append(ids, submit(300))
	}
	pids := map[int64]string{}
	for _, id := range ids {
		w.waitRunning(id)
		w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
		pids[id] = w.starts(id)[0][0]
	}

	doomed := submit(600)
	w.waitRunning(doomed)

	srv.Stop(t, "fast")
	// A cancel issued while the server is down rides out the outage.
	cancel := w.Start(w.cfg, "cancel", strconv.FormatInt(doomed, 10), "--wait", (grace + 30*time.Second).String())
	// 7 s of outage and what pg_ctl takes besides.
	time.Sleep(7 * time.Second) // deliberately: the outage's length is the fault
	outage := srv.Start(t)
	if outage.Down >= grace {
		t.Fatalf("the server was %s: longer than reconnect_grace %s, so this machine is too slow for what this test proves (TestOutageLongerThanGraceStopsCommandsBeforeAnyRetry proves the longer outage)", outage, grace)
	}
	// Each task process takes its lock again as soon as it can: how long
	// after the server was back, against the grace it had left.
	back := time.Now()
	w.waitLocked(ids, grace-outage.Down, fmt.Sprintf("within reconnect_grace %s of a server %s", grace, outage))
	relock := time.Since(back)
	t.Logf("server %s; every task held its lock again %s after it was back (reconnect_grace %s)", outage, relock.Round(time.Millisecond), grace)
	if err := cancel.Wait(); err != nil {
		log, _ := os.ReadFile(cancel.Log)
		t.Errorf("dama cancel during the outage (%s): %v: %s", outage, err, log)
	}
	if got := w.waitSettled(doomed, 30*time.Second); got.Status != etlcontext.StatusCancelled {
		t.Errorf("the cancelled task is %s", got.Status)
	}
	w.release()

	// Progress lines written while a task could not write coalesce: at
	// most the steps of the outage and of its taking the lock again
	// are missing, and some slack for the writes queued meanwhile.
	mayCoalesce := int((outage.Down+relock)/(100*time.Millisecond)) + 30
	for _, id := range ids {
		got := w.waitSettled(id, 90*time.Second)
		if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("context %d: %s after %d attempts, want DONE after 1: a server %s, its locks taken again %s after, within reconnect_grace %s", id, got.Status, got.Attempt, outage, relock.Round(time.Millisecond), grace)
		}
		if starts := w.starts(id); len(starts) != 1 || starts[0][0] != pids[id] {
			t.Errorf("context %d: starts %v, want the single start of pid %s", id, starts, pids[id])
		}
		events, err := etlcontext.Events(context.Background(), w.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		var progress int
		var lastProgress string
		for _, e := range events {
			switch e.Type {
			case "sample:ERROR":
				t.Errorf("context %d: ERROR event %s", id, e.Payload)
			case "sample:PROGRESS", "sample:CHECKPOINT":
				key := e.Type + string(e.Payload)
				if seen[key] {
					t.Errorf("context %d: %s %s stored twice", id, e.Type, e.Payload)
				}
				seen[key] = true
				if e.Type == "sample:PROGRESS" {
					progress++
					lastProgress = string(e.Payload)
				}
			}
		}
		// Progress reported while the server was down coalesces: the
		// newest waiting one stands for those before it.
		if progress > 300 || progress < 300-mayCoalesce || lastProgress != `{"of": 300, "step": 300}` {
			t.Errorf("context %d: %d PROGRESS events, the last %s; want at most 300 and at least %d (a server %s, locks taken again %s after), the last step 300 of 300",
				id, progress, lastProgress, 300-mayCoalesce, outage, relock.Round(time.Millisecond))
		}
	}
}

// waitLocked waits until every task of ids holds its lock again, for at
// most within: a bound the product promises (reconnect_grace), not
// stretched on a slow machine.
func (w *world) waitLocked(ids []int64, within time.Duration, what string) {
	w.T.Helper()
	testenv.Within(w.T, within, "every task to hold its lock again "+what, func() (bool, error) {
		for _, id := range ids {
			// A read that fails (a pooled connection to the server
			// before its restart or failover) is waited through.
			got, err := etlcontext.Tasks(context.Background(), w.Pool, etlcontext.TaskQuery{ID: id})
			if err != nil || len(got) != 1 || !got[0].InitialEventLocked {
				return false, fmt.Errorf("task %d not locked: %d rows, %v", id, len(got), err)
			}
		}
		return true, nil
	})
}

func TestOutageLongerThanGraceStopsCommandsBeforeAnyRetry(t *testing.T) {
	testenv.LockModes(t, testOutageLongerThanGraceStopsCommandsBeforeAnyRetry)
}

func testOutageLongerThanGraceStopsCommandsBeforeAnyRetry(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	w := newBeatWorld(t, env, "reconnect_grace: 2s")
	w.Start(w.cfg, "supervisor")
	id := w.submit()
	running := (&world{Env: env}).waitFor(id, 20*time.Second, "to record its command", func(t etlcontext.Task) bool { return t.CommandPGID != nil })
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })

	srv.Stop(t, "fast")
	stoppedAt := time.Now()
	// Within the grace, the kill grace and a little, while the server is
	// still down, every process of the command's group is gone.
	testenv.Within(t, 20*time.Second, "attempt 1 to stop its command while the server is down", func() (bool, error) {
		return errors.Is(syscall.Kill(-*running.CommandPGID, 0), syscall.ESRCH), nil
	})
	t.Logf("the command's group was gone %s after the server stopped", time.Since(stoppedAt).Round(time.Millisecond))
	// A supervisor started during the outage waits for the database.
	late := w.Start(w.cfg, "supervisor")
	testenv.Eventually(t, 10*time.Second, "the late supervisor to report the outage", func() (bool, error) {
		log, err := os.ReadFile(late.Log)
		return strings.Contains(string(log), "database unreachable; waiting for it"), err
	})
	srv.Start(t)
	late.WaitReady(t, 20*time.Second)

	got := (&world{Env: env}).waitSettled(id, 90*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	w.assertNoOverlap(t, id)
	if starts := w.starts(id); len(starts) != 2 || strings.Join(starts[1][3:], "") != `{"step":5}` {
		t.Errorf("starts %v: want attempt 2 to resume from checkpoint {\"step\":5}", starts)
	}
}

// quietConfig runs one quiet task (a command that sleeps) with a short
// heartbeat_interval, so that a silent connection is noticed within 4 s.
const quietConfig = `
lock_mode: %s
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 1s
kinds:
  quiet: { command: ["/bin/sleep", "%d"], max_attempts: 1 }
`

// A row-mode task hears cancellations on its write connection, not on its
// lock connection. When that connection goes silent without a reset (an
// idle flow dropped by a load balancer), the task process notices (the
// kernel probes it), reconnects, and reads the cancellation it missed.
func TestCancelReachesATaskWhoseWriteConnectionWentSilent(t *testing.T) {
	t.Parallel()
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	cfg := env.WriteConfig(fmt.Sprintf(quietConfig, "row", 120))
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "quiet")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	w.waitRunning(id)
	testenv.SilenceConnection(t, env.Pool, fmt.Sprintf("dama-task:%d", id))
	cancel := w.Dama(cfg, "cancel", strconv.FormatInt(id, 10), "--wait", "25s")
	if cancel.Code != 0 || strings.TrimSpace(cancel.Stdout) != "CANCELLED" {
		t.Fatalf("dama cancel: exit %d, stdout %q, stderr %q: want CANCELLED", cancel.Code, cancel.Stdout, cancel.Stderr)
	}
}

// A server-wide idle_session_timeout (PostgreSQL 14+) ends sessions that
// wait idle: dama's wait idle by design (an advisory-mode task's lock, a
// supervisor's listeners), and turn it off for themselves, so a quiet task
// never loses its lock to it.
func TestIdleSessionTimeoutTakesNoLock(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	var name string
	if err := env.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET idle_session_timeout = '1s'`, pgx.Identifier{name}.Sanitize())); err != nil {
		t.Skipf("idle_session_timeout needs PostgreSQL 14+: %v", err)
	}
	env.Pool.Reset() // new sessions take the setting
	cfg := env.WriteConfig(fmt.Sprintf(quietConfig, "advisory", 6))
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "quiet")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
	taskLog, _ := os.ReadFile(filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id)))
	if strings.Contains(string(taskLog), "lost the database") {
		t.Errorf("the task lost its lock to idle_session_timeout:\n%s", taskLog)
	}
	supLog, _ := os.ReadFile(sup.Log)
	if strings.Contains(string(supLog), "lost the database connection") {
		t.Errorf("the supervisor lost its liveness connection to idle_session_timeout:\n%s", supLog)
	}
}

// The database fails over to a synchronous streaming replica (the primary
// crashes, the replica is promoted) while tasks run: with a DATABASE_URL
// naming both hosts, every task rides it out like a restart, by its
// original process, and ends DONE at attempt 1 with no event lost or
// stored twice.
func TestFailoverToAStreamingReplicaKillsNoTask(t *testing.T) {
	testenv.LockModes(t, testFailoverToAStreamingReplicaKillsNoTask)
}

func testFailoverToAStreamingReplicaKillsNoTask(t *testing.T) {
	primary := testenv.NewServer(t)
	replica := testenv.NewReplica(t, primary)
	env := testenv.NewOn(t, primary)
	failoverURL := testenv.FailoverURL(t, env.URL, primary, replica)
	viaBoth := []string{"DATABASE_URL=" + failoverURL}
	pool, err := pgxpool.New(context.Background(), failoverURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	both := *env
	both.Pool = pool
	const grace = 60 * time.Second
	w := &world{Env: &both, cfg: env.WriteConfig(strings.Replace(sampleConfigFor(10), "kill_grace: 1s", fmt.Sprintf("kill_grace: 1s\nreconnect_grace: %s", grace), 1)),
		startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	env.StartWith(w.cfg, viaBoth, nil, "supervisor")
	var ids []int64
	for range 4 {
		// 20 s of steps, then a wait for the test's release: the commands
		// run through the failover, however long it takes.
		args, _ := json.Marshal(map[string]any{"steps": 200, "step_ms": 100, "starts_dir": w.startsDir, "until_file": w.releaseFile()})
		res := env.DamaWith(w.cfg, viaBoth, "submit", "sample", "--args", string(args))
		if res.Code != 0 {
			t.Fatalf("submit: %s", res.Stderr)
		}
		ids = append(ids, testenv.Atoi(t, res.Stdout))
	}
	pids := map[int64]string{}
	for _, id := range ids {
		w.waitRunning(id)
		w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
		pids[id] = w.starts(id)[0][0]
	}

	began := time.Now()
	primary.Stop(t, "immediate")
	replica.Promote(t)
	failover := time.Since(began)
	if failover >= grace {
		t.Fatalf("the failover took %s: longer than reconnect_grace %s, so this machine is too slow for what this test proves", failover.Round(time.Millisecond), grace)
	}
	w.waitLocked(ids, grace-failover, fmt.Sprintf("within reconnect_grace %s of a failover of %s", grace, failover.Round(time.Millisecond)))
	t.Logf("failover in %s; every task held its lock again %s after it began", failover.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	w.release()

	for _, id := range ids {
		got := w.waitSettled(id, 2*time.Minute)
		if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("context %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
		}
		if starts := w.starts(id); len(starts) != 1 || starts[0][0] != pids[id] {
			t.Errorf("context %d: starts %v, want the single start of pid %s", id, starts, pids[id])
		}
		events, err := etlcontext.Events(context.Background(), pool, id)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		var last string
		for _, e := range events {
			switch e.Type {
			case "sample:ERROR":
				t.Errorf("context %d: ERROR event %s", id, e.Payload)
			case "sample:PROGRESS", "sample:CHECKPOINT":
				key := e.Type + string(e.Payload)
				if seen[key] {
					t.Errorf("context %d: %s %s stored twice", id, e.Type, e.Payload)
				}
				seen[key] = true
				if e.Type == "sample:PROGRESS" {
					last = string(e.Payload)
				}
			}
		}
		if last != `{"of": 200, "step": 200}` {
			t.Errorf("context %d: last PROGRESS %s, want step 200 of 200", id, last)
		}
	}
}

// A task's outcome that committed as its connection was cut (the commit
// waited for a synchronous replica that was down, and its backend was
// ended) has its reply lost: the write tried again finds the context
// finished by the attempt's own outcome. The task process takes the
// outcome for written, as it is: no error, not a run superseded.
func TestAnOutcomeWhoseReplyWasLostIsTakenForWritten(t *testing.T) {
	testenv.LockModes(t, testAnOutcomeWhoseReplyWasLostIsTakenForWritten)
}

func testAnOutcomeWhoseReplyWasLostIsTakenForWritten(t *testing.T) {
	// No log tail: the outcome is the task process's first write after
	// its command's end, the one whose reply is lost.
	w, id, taskLog := loseTheReplyOf(t, "log_tail_bytes: -1\n", "%INSERT INTO data_manager.event_store%")
	got := w.waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("task %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
	}
	b, err := os.ReadFile(taskLog)
	if err != nil {
		t.Fatal(err)
	}
	if log := string(b); strings.Contains(log, "level=ERROR") || strings.Contains(log, `msg="this run is no longer current`) {
		t.Errorf("the task process took its own outcome, written, for a write refused:\n%s", log)
	}
}

// The last write of a task's log tail, whose reply was lost as in
// TestAnOutcomeWhoseReplyWasLostIsTakenForWritten, is made again and kept
// once: the task is DONE, and its tail holds each line once.
func TestALogTailWhoseReplyWasLostIsKeptOnce(t *testing.T) {
	testenv.LockModes(t, testALogTailWhoseReplyWasLostIsKeptOnce)
}

func testALogTailWhoseReplyWasLostIsKeptOnce(t *testing.T) {
	// A tail written only before the outcome.
	w, id, _ := loseTheReplyOf(t, "log_tail_interval: 1h\n", "%data_manager.append_log%")
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("task %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
	}
	pieces, err := etlcontext.LogSince(context.Background(), w.Pool, id, etlcontext.LogPos{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var kept strings.Builder
	for _, p := range pieces {
		kept.Write(p.Data)
	}
	if n := strings.Count(kept.String(), "command starting"); n != 1 {
		t.Errorf("the tail holds %d lines of the command's start, want 1:\n%s", n, kept.String())
	}
}

// loseTheReplyOf runs a waiter task, with configuration added at the top
// of its world's, on a server whose commits wait for a synchronous replica;
// stops the replica, lets the command end, and ends the backend of the
// first write whose statement is like query as it waits for the replica
// (its commit is made, its reply lost); then starts the replica again. It
// returns the world, the task and its log file.
func loseTheReplyOf(t *testing.T, configuration, query string) (*world, int64, string) {
	t.Helper()
	primary := testenv.NewServer(t)
	replica := testenv.NewReplica(t, primary)
	env := testenv.NewOn(t, primary)
	goFile := filepath.Join(env.Dir, "go")
	w := &world{Env: env, cfg: env.WriteConfig(configuration + sampleConfigFor(1) + waiterKind(goFile, 1))}
	env.Start(w.cfg, "supervisor")
	id := w.submitOf("waiter")
	taskLog := filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id))
	// Recorded, not only started: the record's commit must not be the
	// write that waits for the replica.
	w.waitFor(id, 20*time.Second, "to record its command", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.CommandPGID != nil
	})
	// From now on a commit waits for the replica, which is down.
	replica.Stop(t, "immediate")
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var ended int
	testenv.Eventually(t, 30*time.Second, "the write's commit to wait for the replica, and its backend to be ended", func() (bool, error) {
		err := env.Pool.QueryRow(context.Background(), `
			SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			 WHERE wait_event = 'SyncRep' AND query LIKE $1`, query).Scan(&ended)
		return ended > 0, err
	})
	replica.Start(t)
	return w, id, taskLog
}

// A database outage is one ERROR line when the supervisor loses it and one
// INFO line when it is back, with its length; what failed meanwhile (River's
// fetches several times a second, each step) is counted, not logged.
func TestADatabaseOutageIsTwoLinesOfLog(t *testing.T) {
	t.Parallel()
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	cfg := env.WriteConfig(sampleConfigFor(2))
	sup := env.Start(cfg, "supervisor")
	sup.WaitReady(t, time.Minute)
	outage := srv.Restart(t, 4*time.Second)
	var log string
	testenv.Eventually(t, time.Minute, "the supervisor to log the database back", func() (bool, error) {
		out, err := os.ReadFile(sup.Log)
		log = string(out)
		return strings.Contains(log, "database connection back"), err
	})
	var said []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			said = append(said, line)
		}
		if strings.Contains(line, "database connection back") {
			// From the liveness connection's loss, after the stop began,
			// to its taking the lock again, after the start ended: within
			// the server's outage and a reconnection's delay or two.
			_, took, _ := strings.Cut(line, " outage=")
			took, _, _ = strings.Cut(took, " ")
			if d, err := time.ParseDuration(took); err != nil || d < 4*time.Second || d > outage.Down+5*time.Second {
				t.Errorf("the outage's end says it lasted %q, want from 4s to the server's outage and 5s (a reconnection's delay or two): server %s: %s", took, outage, line)
			}
			if strings.Contains(line, "warnings_muted=0") {
				t.Errorf("nothing muted: %s", line)
			}
			break
		}
	}
	// It said at start what outage its tasks ride out: reconnect_grace's
	// default, and the fencing window of its settings (4 s to notice a
	// silent connection, the grace, kill_grace 1s, 2 s of margin).
	if !strings.Contains(log, "a database restart or failover shorter than reconnect_grace keeps running tasks running") ||
		!strings.Contains(log, "reconnect_grace=2m0s fence_window=2m7s") {
		t.Errorf("the supervisor's log does not say what outage it rides out:\n%s", log)
	}
	if len(said) != 1 || !strings.Contains(said[0], `level=ERROR msg="lost the database connection`) {
		t.Errorf("up to the outage's end the supervisor logged %d warnings and errors, want the outage's one:\n%s", len(said), strings.Join(said, "\n"))
	}
}

// A database outage is two lines of the log of a task that runs through it,
// its task process's loss of the database and its return, rather than a
// warning per try to connect again; and at most two errors of the
// supervisor's. River's completion of the job of a task that ended just
// before, cut short by the outage, fails through it (River gives up, and
// tries the batch again later) unsaid, and the job is completed after it.
func TestAnOutageIsTwoLinesOfATasksLogAndLosesNoCompletion(t *testing.T) {
	testenv.LockModes(t, testAnOutageIsTwoLinesOfATasksLogAndLosesNoCompletion)
}

func testAnOutageIsTwoLinesOfATasksLogAndLosesNoCompletion(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	ctx := context.Background()
	// Once: River's first completion of a job sleeps on the server, for
	// the server to go down under it.
	if _, err := env.Pool.Exec(ctx, `
CREATE SEQUENCE public.hold_completion_once;
CREATE FUNCTION public.hold_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('public.hold_completion_once') = 1 THEN
		PERFORM pg_sleep(60);
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER hold_completion BEFORE UPDATE ON river_job
	FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state = 'completed') EXECUTE FUNCTION public.hold_completion();`); err != nil {
		t.Fatal(err)
	}
	w := &world{Env: env, cfg: env.WriteConfig(sampleConfigFor(2)), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sup := w.Start(w.cfg, "supervisor")
	through := w.submitHeld(3, 100)
	w.waitRunning(through)
	ended := w.submit(3, 100)
	testenv.Eventually(t, time.Minute, "River's completion of the ended task's job to sleep on the server", func() (bool, error) {
		var n int
		err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`).Scan(&n)
		return n == 1, err
	})
	// The stop cuts River's completion short. River tries it three times,
	// 1 s and 2 s apart, and gives up 4 s after the third: a server back 3 s
	// after the stop began fails all three, and the supervisor sees it
	// back before River gives up.
	began := time.Now()
	srv.Stop(t, "fast")
	time.Sleep(time.Until(began.Add(3 * time.Second))) // deliberately: the outage's length is the fault
	outage := srv.Start(t)
	if outage.Down > 6*time.Second {
		t.Logf("a server %s: River may have given up within the outage, which this run then shows muted, not after it", outage)
	}

	// The ended task's job is completed after the outage, not left running.
	if got := w.waitSettled(ended, time.Minute); got.Status != etlcontext.StatusDone {
		t.Errorf("the task that ended before the outage is %s, want DONE", got.Status)
	}
	var state string
	if err := env.Pool.QueryRow(ctx, `SELECT j.state FROM river_job AS j JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id WHERE c.etl_context_id = $1`, ended).Scan(&state); err != nil || state != "completed" {
		t.Errorf("its job is %q (%v), want completed", state, err)
	}
	taskLog := filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", through))
	testenv.Eventually(t, time.Minute, "the running task to log the database back", func() (bool, error) {
		log, err := os.ReadFile(taskLog)
		return strings.Contains(string(log), "database back after"), err
	})
	w.release()
	if got := w.waitSettled(through, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("the task that ran through the outage is %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}

	// Between the command's start and its exit, the task's log has the
	// command's lines and dama's two of the outage.
	log, err := os.ReadFile(taskLog)
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	running := false
	for line := range strings.Lines(string(log)) {
		switch {
		case strings.Contains(line, `msg="command starting"`):
			running = true
		case strings.Contains(line, `msg="command exited"`):
			running = false
		case running && strings.HasPrefix(line, "time="):
			said = append(said, line)
		}
	}
	if len(said) != 2 || !strings.Contains(said[0], `level=WARN msg="lost the database: the command keeps running`) ||
		!strings.Contains(said[1], `level=INFO msg="database back after `) || strings.Contains(string(log), "dial error") {
		t.Errorf("while the command ran (a server %s), the task's log said, besides the command's lines, %d lines; want the outage's two, and no pgx dial error:\n%s", outage, len(said), strings.Join(said, ""))
	}
	// Stopped, the supervisor has written what it held.
	sup.Kill(t, syscall.SIGTERM)
	if err := sup.Wait(); err != nil {
		t.Errorf("the supervisor stopped by SIGTERM: %v", err)
	}
	supLog, err := os.ReadFile(sup.Log)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	for line := range strings.Lines(string(supLog)) {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "jobcompleter") {
			errs = append(errs, line)
		}
	}
	if len(errs) > 2 || strings.Contains(string(supLog), "jobcompleter") {
		t.Errorf("the supervisor logged %d errors (a server %s), want at most 2, none of River's completer:\n%s", len(errs), outage, strings.Join(errs, ""))
	}
}

// A task process whose record of itself commits on the server after the
// client gave up on it (here: the server holds the statement 22s, past the
// runner's 20s) must give the launch back, not leave a record that the
// supervisor counts as the death of an attempt that never started.
func TestRecordCommittedAfterItsTimeoutSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	// Once (a sequence, which no rollback takes back): the first record of
	// a task process holds the row past the runner's 20 s, its client's
	// cancels caught, then commits.
	if _, err := env.Pool.Exec(ctx, `
CREATE SEQUENCE public.slow_record_once;
CREATE FUNCTION public.slow_record() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
	until timestamptz := clock_timestamp() + interval '22 seconds';
BEGIN
	IF OLD.pid IS NULL AND NEW.pid IS NOT NULL AND nextval('public.slow_record_once') = 1 THEN
		WHILE clock_timestamp() < until LOOP
			BEGIN
				PERFORM pg_sleep(0.5);
			EXCEPTION WHEN query_canceled THEN
				NULL;
			END;
		END LOOP;
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER slow_record BEFORE UPDATE ON data_manager.etl_contexts
	FOR EACH ROW EXECUTE FUNCTION public.slow_record();`); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(fmt.Sprintf(quietConfig, "row", 1))
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "quiet")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	got := w.waitSettled(id, 120*time.Second)
	events, err := etlcontext.Events(ctx, env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Type == "quiet:ERROR" {
			t.Errorf("attempt %d failed: %s", e.Attempt, e.Payload)
		}
	}
	// max_attempts is 1: a spent attempt leaves it FAILED.
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
}
