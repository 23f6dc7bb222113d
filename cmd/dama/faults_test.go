package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/taskrunner"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// beatScript is a task that forks: a background worker, which ignores
// SIGTERM, writes "<attempt> <unix ns>" to beats-<id> every 50ms for as
// long as it lives. The first attempt reports a checkpoint and waits for its
// worker forever; later attempts record the checkpoint they got, beat for a
// second and exit 0.
const beatScript = `
beats={{dir}}/beats-$DAMA_ETL_CONTEXT_ID
echo "$DAMA_ATTEMPT $$ $(date +%s%N) ${DAMA_CHECKPOINT:-none}" >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID
if [ "$DAMA_ATTEMPT" = 1 ]; then
	echo '{"type":"checkpoint","payload":{"step":5}}' >&3
	(trap '' TERM; while :; do echo "1 $(date +%s%N)" >> "$beats"; sleep 0.05; done) &
	wait
else
	for i in 1 2 3 4 5 6 7 8 9 10; do echo "$DAMA_ATTEMPT $(date +%s%N)" >> "$beats"; sleep 0.1; done
fi
`

type beatWorld struct {
	*testenv.Env
	cfg string
}

func newBeatWorld(t *testing.T, env *testenv.Env, extra string) *beatWorld {
	script := filepath.Join(env.Dir, "beat.sh")
	if err := os.WriteFile(script, []byte(strings.ReplaceAll(beatScript, "{{dir}}", env.Dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 1s
` + extra + `
kinds:
  beat:
    command: ["/bin/sh", "{{dir}}/beat.sh"]
    max_attempts: 3
`)
	return &beatWorld{Env: env, cfg: cfg}
}

func (w *beatWorld) submit() int64 {
	w.T.Helper()
	res := w.Dama(w.cfg, "submit", "beat")
	if res.Code != 0 {
		w.T.Fatalf("submit: %s", res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

// beats returns, per attempt, the times its processes wrote.
func (w *beatWorld) beats(id int64) map[int][]int64 {
	data, _ := os.ReadFile(filepath.Join(w.Dir, fmt.Sprintf("beats-%d", id)))
	out := map[int][]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		a, _ := strconv.Atoi(f[0])
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		out[a] = append(out[a], ns)
	}
	return out
}

// starts returns the lines "<attempt> <pid> <unix ns> <checkpoint>".
func (w *beatWorld) starts(id int64) [][]string {
	data, _ := os.ReadFile(filepath.Join(w.Dir, fmt.Sprintf("starts-%d", id)))
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			out = append(out, strings.Fields(line))
		}
	}
	return out
}

// killRunnerAndSettle SIGKILLs the task process pid of context id and waits
// for the task to finish DONE by a second attempt; it returns when the kill
// was sent and the settled task.
func (w *beatWorld) killRunnerAndSettle(t *testing.T, id int64, pid int) (killedAt int64, got etlcontext.Task) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt = time.Now().UnixNano()
	got = (&world{Env: w.Env}).waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	return killedAt, got
}

// assertNoOverlap fails unless every process of each attempt wrote its last
// beat before the next attempt started, by the times the commands wrote.
func (w *beatWorld) assertNoOverlap(t *testing.T, id int64) {
	t.Helper()
	beats := w.beats(id)
	for _, s := range w.starts(id) {
		attempt, _ := strconv.Atoi(s[0])
		started, _ := strconv.ParseInt(s[2], 10, 64)
		for prev := 1; prev < attempt; prev++ {
			if n := len(beats[prev]); n > 0 && slices.Max(beats[prev]) >= started {
				t.Errorf("context %d: attempt %d wrote %s after attempt %d started",
					id, prev, time.Duration(slices.Max(beats[prev])-started), attempt)
			}
		}
	}
}

func TestForkingCommandNeverOverlapsItsRetry(t *testing.T) {
	testenv.LockModes(t, testForkingCommandNeverOverlapsItsRetry)
}

func testForkingCommandNeverOverlapsItsRetry(t *testing.T) {
	env := testenv.New(t)
	w := newBeatWorld(t, env, "")
	w.Start(w.cfg, "supervisor")
	id := w.submit()
	running := (&world{Env: env}).waitRunning(id)
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })

	// SIGKILL the task process: its command (sh) dies with it, its worker
	// does not.
	killedAt, _ := w.killRunnerAndSettle(t, id, *running.PID)
	beats := w.beats(id)
	if n := len(beats[1]); n == 0 || slices.Max(beats[1]) < killedAt {
		t.Fatalf("the worker of attempt 1 did not outlive its task process (last beat before the kill): the test proves nothing")
	}
	w.assertNoOverlap(t, id)
	starts := w.starts(id)
	if len(starts) != 2 || strings.Join(starts[1][3:], "") != `{"step":5}` {
		t.Errorf("starts %v: want attempt 2 to resume from checkpoint {\"step\":5}", starts)
	}
	// The worker is gone for good.
	last := slices.Max(beats[1])
	time.Sleep(300 * time.Millisecond) // deliberately: a window in which a live worker would beat
	if slices.Max(w.beats(id)[1]) != last {
		t.Errorf("the worker of attempt 1 still runs after the task finished")
	}
}

// socketEnv returns a copy of env whose pool reaches the test's database
// over the server's Unix socket, which Silence does not cut, and that URL.
func socketEnv(t *testing.T, env *testenv.Env) (*testenv.Env, string) {
	t.Helper()
	sock, err := url.Parse(env.Server.SocketURL())
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	sock.Path = tcp.Path
	pool, err := pgxpool.New(context.Background(), sock.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	copied := *env
	copied.Pool = pool
	return &copied, sock.String()
}

func TestPostgresRestartKillsNoTask(t *testing.T) {
	testenv.LockModes(t, testPostgresRestartKillsNoTask)
}

func testPostgresRestartKillsNoTask(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	// Every progress line is stored (progress_interval 1ms): none may be
	// stored twice through the outage.
	w := &world{Env: env, cfg: env.WriteConfig(strings.NewReplacer("kill_grace: 1s", "kill_grace: 1s\nreconnect_grace: 10s", "progress_interval: 100ms", "progress_interval: 1ms").Replace(sampleConfigFor(10))),
		startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.Start(w.cfg, "supervisor")
	var ids []int64
	for range 4 {
		// Progress and a checkpoint every 100ms, for about 30s: the
		// commands run through the whole outage.
		ids = append(ids, w.submit(300, 100))
	}
	pids := map[int64]string{}
	for _, id := range ids {
		w.waitRunning(id)
		w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
		pids[id] = w.starts(id)[0][0]
	}

	doomed := w.submit(600, 100)
	w.waitRunning(doomed)

	srv.Stop(t, "fast")
	// A cancel issued while the server is down rides out the outage.
	cancel := w.Start(w.cfg, "cancel", strconv.FormatInt(doomed, 10), "--wait", "60s")
	// The length of the outage: 70% of reconnect_grace, so that time lost
	// between reconnection attempts shows.
	time.Sleep(7 * time.Second)
	srv.Start(t)
	if err := cancel.Wait(); err != nil {
		log, _ := os.ReadFile(cancel.Log)
		t.Errorf("dama cancel during the outage: %v: %s", err, log)
	}
	if got := w.waitSettled(doomed, 30*time.Second); got.Status != etlcontext.StatusCancelled {
		t.Errorf("the cancelled task is %s", got.Status)
	}

	for _, id := range ids {
		got := w.waitSettled(id, 90*time.Second)
		if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("context %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
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
		if progress > 300 || progress < 200 || lastProgress != `{"of": 300, "step": 300}` {
			t.Errorf("context %d: %d PROGRESS events, the last %s; want at most 300, the last step 300 of 300", id, progress, lastProgress)
		}
	}
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
	testenv.Eventually(t, 20*time.Second, "attempt 1 to stop its command while the server is down", func() (bool, error) {
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

// anotherHost skips the test where a supervisor cannot be given a host of
// its own (a PID namespace, which needs root).
func anotherHost(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		t.Skipf("another host needs unshare --pid (root): %v %s", err, out)
	}
}

// twoHosts is a beat task run by supervisor A, whose processes reach the
// server over TCP, beside supervisor B on another host (a PID namespace of
// its own) that reaches it over its Unix socket: silencing the server's
// TCP port cuts A off and leaves B.
type twoHosts struct {
	*beatWorld
	srv *testenv.Server
	// viaSocket is the environment of a dama command that reaches the
	// server as B does.
	viaSocket []string
	id        int64
	// first is the task as attempt 1 runs it, beating, on A.
	first etlcontext.Task
}

func newTwoHosts(t *testing.T, extra string) *twoHosts {
	t.Helper()
	anotherHost(t)
	srv := testenv.NewServer(t)
	env, socketURL := socketEnv(t, testenv.NewOn(t, srv))
	w := newBeatWorld(t, env, extra)
	w.Start(w.cfg, "supervisor")
	id := w.submit()
	first := (&world{Env: env}).waitRunning(id)
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })
	viaSocket := []string{"DATABASE_URL=" + socketURL}
	env.StartWith(w.cfg, viaSocket, []string{"unshare", "--pid", "--fork", "--mount-proc"}, "supervisor")
	return &twoHosts{beatWorld: w, srv: srv, viaSocket: viaSocket, id: id, first: first}
}

func TestSilentLockConnectionIsFencedBeforeARetryElsewhere(t *testing.T) {
	testenv.LockModes(t, testSilentLockConnectionIsFencedBeforeARetryElsewhere)
}

func testSilentLockConnectionIsFencedBeforeARetryElsewhere(t *testing.T) {
	h := newTwoHosts(t, "reconnect_grace: 3s")
	w, env, id, first := h.beatWorld, h.Env, h.id, h.first
	// Every TCP packet to or from the server is dropped: no reset, no FIN.
	testenv.Silence(t, h.srv.Port())
	silencedAt := time.Now()

	got := (&world{Env: env}).waitSettled(id, 120*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	if deref(got.HostID) == deref(first.HostID) {
		t.Errorf("attempt 2 ran on host %v, the host of attempt 1: want supervisor B's", deref(got.HostID))
	}
	w.assertNoOverlap(t, id)
	t.Logf("attempt 1's last beat %s after the silence; attempt 2 started %s after it",
		time.Duration(slices.Max(w.beats(id)[1])-silencedAt.UnixNano()).Round(time.Millisecond),
		time.Duration(startNS(w.starts(id)[1])-silencedAt.UnixNano()).Round(time.Millisecond))
}

func startNS(start []string) int64 {
	ns, _ := strconv.ParseInt(start[2], 10, 64)
	return ns
}

func TestAHostThatCannotLaunchSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// log_dir lies under a file: no process of this host can create it.
	blocker := filepath.Join(env.Dir, "blocker")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/blocker/logs
poll_interval: 200ms
kinds:
  sample: { command: ["{{sample}}"], max_attempts: 1 }
  missing: { command: ["/nonexistent/etl"], max_attempts: 1 }
`)
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "sample")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	testenv.Eventually(t, 20*time.Second, "the supervisor to report the failed launch", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		return strings.Count(string(log), "launch failed") >= 1, err
	})
	// Several launches later (one a poll): still QUEUED, no attempt
	// spent, one error line.
	// Each try is a step of the task's job: River records when it began.
	tries := func(id int64) func() (bool, error) {
		seen := map[time.Time]bool{}
		return func() (bool, error) {
			var at time.Time
			err := w.Pool.QueryRow(context.Background(), `
				SELECT j.attempted_at FROM river_job AS j JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
				 WHERE c.etl_context_id = $1 AND j.attempted_at IS NOT NULL`, id).Scan(&at)
			seen[at] = true
			return len(seen) >= 6, err
		}
	}
	testenv.Eventually(t, 30*time.Second, "several more launches of the task", tries(id))
	// Each try shows RUNNING, attempt 1 from its start until the launch is
	// taken back a moment later; between tries the task is QUEUED with no
	// attempt spent. A spent attempt would leave it FAILED (max_attempts
	// 1), never QUEUED again.
	testenv.Eventually(t, 10*time.Second, "the task QUEUED between tries, with no attempt spent", func() (bool, error) {
		got := w.task(id)
		return got.Status == etlcontext.StatusQueued && got.Attempt == 0, fmt.Errorf("%s, attempt %d", got.Status, got.Attempt)
	})
	log, _ := os.ReadFile(sup.Log)
	if n := strings.Count(string(log), `level=ERROR msg="launch failed`); n != 1 {
		t.Errorf("the repeated launch failure was logged as an error %d times, want once", n)
	}
	// The operator repairs the host: the task runs, as its first attempt.
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("after the repair: %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}

	// A kind whose executable this host lacks: the task process says why
	// in a WARNING, and the launch is taken back.
	res = w.Dama(cfg, "submit", "missing")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	missing := testenv.Atoi(t, res.Stdout)
	testenv.Eventually(t, 20*time.Second, "a WARNING saying this host cannot run the task", func() (bool, error) {
		events, err := etlcontext.Events(context.Background(), w.Pool, missing)
		for _, e := range events {
			if e.Type == "missing:WARNING" && strings.Contains(string(e.Payload), "/nonexistent/etl") {
				return true, nil
			}
		}
		return false, err
	})
	// Several launches later: still one WARNING.
	testenv.Eventually(t, 30*time.Second, "several more launches of the task", tries(missing))
	if got := w.task(missing); got.Status.Finished() || got.Attempt > 1 {
		t.Errorf("a missing executable spent the task's attempt: %s, attempt %d", got.Status, got.Attempt)
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, missing)
	if err != nil {
		t.Fatal(err)
	}
	warnings := 0
	for _, e := range events {
		if e.Type == "missing:WARNING" {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d WARNING events for the missing executable, want one for the attempt", warnings)
	}
	log, _ = os.ReadFile(sup.Log)
	if n := strings.Count(string(log), `level=ERROR msg="launch failed`); n != 2 {
		t.Errorf("the two tasks' repeated launch failures were logged as errors %d times, want once each", n)
	}
}

func TestOrphansOfAKilledTaskProcessAreStoppedBeforeARetryElsewhere(t *testing.T) {
	testenv.LockModes(t, testOrphansOfAKilledTaskProcessAreStoppedBeforeARetryElsewhere)
}

func testOrphansOfAKilledTaskProcessAreStoppedBeforeARetryElsewhere(t *testing.T) {
	anotherHost(t)
	env := testenv.New(t)
	w := newBeatWorld(t, env, "reconnect_grace: 0s")
	// A supervisor of this host launches the task, then is replaced by one
	// that serves another queue: it never steps the task, it only looks
	// after this host's processes.
	first := w.Start(w.cfg, "supervisor")
	id := w.submit()
	running := (&world{Env: env}).waitFor(id, 30*time.Second, "to record its command", func(t etlcontext.Task) bool { return t.CommandPGID != nil })
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })
	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sweeper := w.Start(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kill_grace: 1s
queues: { other: {} }
kinds:
  noop: { queue: other, command: ["/bin/true"] }
`), "supervisor")
	// The only supervisor of the task's queue runs on another host.
	w.StartWrapped(w.cfg, []string{"unshare", "--pid", "--fork", "--mount-proc"}, "supervisor")

	// The task process dies; the kernel kills its command, not the worker
	// the command forked, which ignores SIGTERM.
	killedAt, got := w.killRunnerAndSettle(t, id, *running.PID)
	if deref(got.HostID) == deref(running.HostID) {
		t.Fatalf("attempt 2 ran on the first host: the test proves nothing")
	}
	if beats := w.beats(id)[1]; len(beats) == 0 || slices.Max(beats) < killedAt {
		t.Fatalf("the worker did not outlive its task process: the test proves nothing")
	}
	w.assertNoOverlap(t, id)
	log, _ := os.ReadFile(sweeper.Log)
	if !strings.Contains(string(log), "processes of its attempt live on; stopping them") {
		t.Errorf("the supervisor of the first host did not report stopping the orphans")
	}
}

func TestNoConnectionForTheTaskProcessSpendsNoAttempt(t *testing.T) {
	testenv.LockModes(t, testNoConnectionForTheTaskProcessSpendsNoAttempt)
}

func testNoConnectionForTheTaskProcessSpendsNoAttempt(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	ctx := context.Background()
	// dama runs as a role whose connection limit the test sets; a
	// superuser would not be limited.
	for _, q := range []string{
		`CREATE ROLE dama_limited LOGIN`,
		`GRANT pg_read_all_data, pg_write_all_data TO dama_limited`,
	} {
		if _, err := env.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	limited, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	limited.User = url.User("dama_limited")
	w := &world{Env: env, cfg: env.WriteConfig(sampleConfigFor(10)), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sup := env.StartWith(w.cfg, []string{"DATABASE_URL=" + limited.String()}, nil, "supervisor")
	// Warm the supervisor up, then allow the role no connection beyond
	// those it holds: the next task process cannot connect.
	warm := w.submit(1, 10)
	w.waitSettled(warm, 30*time.Second)
	if pid := w.keeperPID(); pid != 0 {
		// Host lock mode: the next task process's lock keeper, not the
		// one left idle, is to find no connection.
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the idle lock keeper's connections to end", func() (bool, error) {
			return w.serverConns("dama-keeper") == 0, nil
		})
	}
	// The supervisor's spare task process has its connections already:
	// they are ended, and not counted, so that it has to connect.
	w.spareConns(w.cfg)
	var held int
	if err := env.Pool.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity
		 WHERE usename = 'dama_limited' AND application_name NOT IN ($1, $2)`,
		taskrunner.SpareLockConnName, taskrunner.SpareWriteConnName).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, fmt.Sprintf(`ALTER ROLE dama_limited CONNECTION LIMIT %d`, held)); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, `
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name IN ($1, $2)`,
		taskrunner.SpareLockConnName, taskrunner.SpareWriteConnName); err != nil {
		t.Fatal(err)
	}
	id := w.submit(5, 50)
	testenv.Eventually(t, 30*time.Second, "the supervisor to report the failed launch", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		return strings.Contains(string(log), "launch failed"), err
	})
	if got := w.task(id); got.Status.Finished() || got.Attempt > 1 || len(w.starts(id)) != 0 {
		t.Fatalf("with no connection for its task process: %s, attempt %d, starts %v", got.Status, got.Attempt, w.starts(id))
	}
	if _, err := env.Pool.Exec(ctx, `ALTER ROLE dama_limited CONNECTION LIMIT -1`); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("once connections are free: %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
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
	if strings.Contains(string(taskLog), "lock connection failed") {
		t.Errorf("the task lost its lock to idle_session_timeout:\n%s", taskLog)
	}
	supLog, _ := os.ReadFile(sup.Log)
	if strings.Contains(string(supLog), "lost the database connection") {
		t.Errorf("the supervisor lost its liveness connection to idle_session_timeout:\n%s", supLog)
	}
}

// A task whose lock connection went silent on its host is cancelled from
// elsewhere once its lock is free, then retried: the retry on another host
// does not start until the first attempt's command has surely stopped.
func TestCancelThenRetryWaitsOutTheFenceElsewhere(t *testing.T) {
	testenv.LockModes(t, testCancelThenRetryWaitsOutTheFenceElsewhere)
}

func testCancelThenRetryWaitsOutTheFenceElsewhere(t *testing.T) {
	// The command outlives the silence by reconnect_grace: long enough
	// for the server to free the lock (25 s of keepalives) well before it
	// stops.
	h := newTwoHosts(t, "reconnect_grace: 40s")
	w, env, id, first, viaSocket := h.beatWorld, h.Env, h.id, h.first, h.viaSocket
	testenv.Silence(t, h.srv.Port())
	(&world{Env: env}).waitFor(id, 60*time.Second, "to have its lock freed by the server", func(t etlcontext.Task) bool { return !t.InitialEventLocked })
	// The cancel ends once the attempt is surely over: a fencing window.
	// A shorter wait ends first, the cancellation requested.
	short := env.DamaWith(w.cfg, viaSocket, "cancel", strconv.FormatInt(id, 10), "--wait", "2s")
	if short.Code != 22 || !strings.Contains(short.Stderr, "once its attempt has surely stopped") {
		t.Fatalf("cancel --wait 2s: exit %d, %q; want 22, the cancellation pending", short.Code, short.Stderr)
	}
	cancel := env.StartWith(w.cfg, viaSocket, nil, "cancel", strconv.FormatInt(id, 10), "--wait", "3m")
	if err := cancel.Wait(); err != nil {
		log, _ := os.ReadFile(cancel.Log)
		t.Fatalf("cancel: %v: %s", err, log)
	}
	if got := (&world{Env: env}).task(id); got.Status != etlcontext.StatusCancelled {
		t.Fatalf("after dama cancel: %s, want CANCELLED", got.Status)
	}
	res := env.DamaWith(w.cfg, viaSocket, "retry", strconv.FormatInt(id, 10))
	if res.Code != 0 {
		t.Fatalf("retry: exit %d, %s", res.Code, res.Stderr)
	}
	got := (&world{Env: env}).waitSettled(id, 120*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	if deref(got.HostID) == deref(first.HostID) {
		t.Errorf("attempt 2 ran on host %v, the host of attempt 1: want the other supervisor's", deref(got.HostID))
	}
	w.assertNoOverlap(t, id)
}

// The orphans of a cancelled attempt are stopped: a task whose task
// process was SIGKILLed, leaving its command's worker behind, is recorded
// CANCELLED only once that worker is gone.
func TestCancelledAttemptsOrphansAreStopped(t *testing.T) {
	testenv.LockModes(t, testCancelledAttemptsOrphansAreStopped)
}

func testCancelledAttemptsOrphansAreStopped(t *testing.T) {
	env := testenv.New(t)
	w := newBeatWorld(t, env, "")
	w.Start(w.cfg, "supervisor")
	id := w.submit()
	running := (&world{Env: env}).waitRunning(id)
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })
	if err := syscall.Kill(*running.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now().UnixNano()
	res := env.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "CANCELLED" {
		t.Fatalf("cancel: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}
	got := (&world{Env: env}).waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusCancelled || got.FinishedAt == nil {
		t.Fatalf("%s, want CANCELLED", got.Status)
	}
	beats := w.beats(id)[1]
	if len(beats) == 0 || slices.Max(beats) < killedAt {
		t.Fatalf("the worker did not outlive its task process: the test proves nothing")
	}
	// Every beat before the outcome was recorded, and none after.
	if last := slices.Max(beats); last >= got.FinishedAt.UnixNano() {
		t.Errorf("the worker beat %s after the task was recorded CANCELLED", time.Duration(last-got.FinishedAt.UnixNano()))
	}
	// And it is gone, not merely quiet.
	attempt := hostproc.Attempt{Marker: protocol.RunIDEnv + "=" + *running.RunID}
	testenv.Eventually(t, 10*time.Second, "no process of the cancelled attempt left", func() (bool, error) {
		pids, err := attempt.Processes()
		return len(pids) == 0, err
	})
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
	w := &world{Env: &both, cfg: env.WriteConfig(strings.Replace(sampleConfigFor(10), "kill_grace: 1s", "kill_grace: 1s\nreconnect_grace: 60s", 1)),
		startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	env.StartWith(w.cfg, viaBoth, nil, "supervisor")
	var ids []int64
	for range 4 {
		args, _ := json.Marshal(map[string]any{"steps": 200, "step_ms": 100, "starts_dir": w.startsDir})
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

	primary.Stop(t, "immediate")
	replica.Promote(t)

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
	if n := strings.Count(kept.String(), "command started"); n != 1 {
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
	w.waitRunning(id)
	taskLog := filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id))
	testenv.Eventually(t, 20*time.Second, "the command to start", func() (bool, error) {
		b, _ := os.ReadFile(taskLog)
		return strings.Contains(string(b), "command started"), nil
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
