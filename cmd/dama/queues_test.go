package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// queueWorld is a world whose configuration the test writes, with a Go
// client for submitting many tasks quickly.
func queueWorld(t *testing.T, body string) (*world, *supervisor.Client) {
	t.Helper()
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig(body), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := supervisor.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w, client
}

// submitKind submits a sample task of kind with extra arguments through the
// Go API and returns its id.
func (w *world) submitKind(client *supervisor.Client, kind string, steps, stepMS int, extra map[string]any) int64 {
	w.T.Helper()
	args := map[string]any{"steps": steps, "step_ms": stepMS, "starts_dir": w.startsDir}
	for k, v := range extra {
		args[k] = v
	}
	raw, _ := json.Marshal(args)
	id, _, err := client.Submit(context.Background(), supervisor.SubmitParams{Kind: kind, Args: raw})
	if err != nil {
		w.T.Fatal(err)
	}
	return id
}

// startedOnce fails the test unless every context in ids started exactly
// once.
func (w *world) startedOnce(ids []int64) {
	w.T.Helper()
	for _, id := range ids {
		if starts := w.starts(id); len(starts) != 1 {
			w.T.Errorf("context %d started %d times: %v", id, len(starts), starts)
		}
	}
}

// sampler records, every few milliseconds until stop, the most tasks seen
// RUNNING at once per group that query returns (group text, count).
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  map[string]int
	err  error
}

func (w *world) sample(query string) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), max: map[string]int{}}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			rows, err := w.Pool.Query(context.Background(), query)
			if err == nil {
				for rows.Next() {
					var (
						group string
						n     int
					)
					if err = rows.Scan(&group, &n); err != nil {
						break
					}
					s.mu.Lock()
					s.max[group] = max(s.max[group], n)
					s.mu.Unlock()
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
			}
			if err != nil {
				s.mu.Lock()
				if s.err == nil {
					s.err = err
				}
				s.mu.Unlock()
				return
			}
		}
	}()
	return s
}

func (s *sampler) finish(t *testing.T) map[string]int {
	t.Helper()
	close(s.stop)
	<-s.done
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.max
}

const pauseConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 4 }
  other: { max_running: 4 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  elsewhere: { queue: other, command: ["{{sample}}"] }
`

// A paused queue starts nothing while its running task goes on to DONE and
// another queue runs as usual; dama queues counts what waits; resuming
// starts the waiting tasks at once, each once.
func TestPausedQueueStartsNothingUntilResumed(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, pauseConfig)
	w.Start(w.cfg, "supervisor")
	running := w.submitKind(client, "sample", 15, 100, nil)
	w.waitRunning(running)

	res := w.Dama(w.cfg, "pause", "etl", "--reason", "warehouse maintenance")
	if res.Code != 0 || !strings.Contains(res.Stdout, "queue etl paused") || !strings.Contains(res.Stdout, "warehouse maintenance") {
		t.Fatalf("pause: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	var waiting []int64
	for range 3 {
		waiting = append(waiting, w.submitKind(client, "sample", 1, 10, nil))
	}
	unpaused := w.submitKind(client, "elsewhere", 1, 10, nil)
	for _, id := range waiting {
		w.waitFor(id, 20*time.Second, "to wait for its paused queue", func(t etlcontext.Task) bool {
			return t.WaitingFor != nil && *t.WaitingFor == string(etlcontext.WaitQueuePaused)
		})
	}
	if got := w.waitSettled(unpaused, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task of the other queue: %s", got.Status)
	}
	if got := w.waitSettled(running, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task running when the queue was paused: %s, want DONE", got.Status)
	}
	// Its slot is free now: a poll interval or two later, still nothing of
	// the paused queue has started.
	settle := time.Now().Add(5 * 300 * time.Millisecond)
	for time.Now().Before(settle) {
		for _, id := range waiting {
			if got := w.task(id); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
				t.Fatalf("context %d of the paused queue: %s, attempt %d", id, got.Status, got.Attempt)
			}
		}
		time.Sleep(50 * time.Millisecond) // deliberately: nothing may start in this window
	}
	res = w.Dama(w.cfg, "queues")
	if res.Code != 0 {
		t.Fatalf("queues: %s", res.Stderr)
	}
	line := lineWith(res.Stdout, "etl ", "sample")
	if f := strings.Fields(line); len(f) < 11 || f[2] != "3" || f[6] != "1" || !strings.Contains(line, `yes: "warehouse maintenance"`) {
		t.Errorf("dama queues, want etl sample with 3 queued, 1 done and the pause:\n%s", res.Stdout)
	}
	var stats []etlcontext.QueueStat
	res = w.Dama(w.cfg, "queues", "--json")
	if err := json.Unmarshal([]byte(res.Stdout), &stats); err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if deref(s.Queue) == "etl" && deref(s.Kind) == "sample" && (!s.Paused || s.OldestWaiting == nil || *s.OldestWaiting < time.Second) {
			t.Errorf("dama_queue_stats: %+v, want paused with its oldest task waiting over a second", s)
		}
	}

	res = w.Dama(w.cfg, "resume", "etl")
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "queue etl resumed" {
		t.Fatalf("resume: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	for _, id := range waiting {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s after resume", id, got.Status)
		}
	}
	w.startedOnce(append(waiting, running, unpaused))
	if res := w.Dama(w.cfg, "resume", "etl"); res.Code != 0 || !strings.Contains(res.Stdout, "was not paused") {
		t.Errorf("resume again: exit %d, %q", res.Code, res.Stdout)
	}
}

func lineWith(out string, parts ...string) string {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return l
		}
	}
	return ""
}

// The seed's worry: pausing and resuming quickly, many times, while two
// supervisors start tasks, never starts a task twice nor exceeds the
// queue's bound, and every task ends DONE.
func TestPauseResumeStormStartsEachTaskOnce(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 3 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
`)
	var ids []int64
	for range 24 {
		ids = append(ids, w.submitKind(client, "sample", 2, 20+rng.IntN(60), nil))
	}
	running := w.sample(`SELECT 'etl', count(*) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING'`)
	w.Start(w.cfg, "supervisor")
	w.Start(w.cfg, "supervisor")
	ctx := context.Background()
	// Every start is committed under the queue's lock, which a pause waits
	// for: once PauseQueue returns, the count of tasks ever started holds
	// still until the resume.
	startedSoFar := func() int {
		var n int
		if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE attempt > 0`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	toggles := 0
	for done := false; !done; toggles++ {
		if _, err := client.PauseQueue(ctx, "etl", "storm"); err != nil {
			t.Fatal(err)
		}
		before := startedSoFar()
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // deliberately: the operator's random rhythm
		if after := startedSoFar(); after != before {
			t.Fatalf("%d tasks started while the queue was paused", after-before)
		}
		if _, err := client.ResumeQueue(ctx, "etl"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // deliberately: the operator's random rhythm
		var unfinished int
		if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE etl_status NOT IN ('DONE', 'FAILED', 'CANCELLED')`).Scan(&unfinished); err != nil {
			t.Fatal(err)
		}
		done = unfinished == 0
		if toggles > 3000 {
			t.Fatalf("%d tasks unfinished after %d pauses and resumes", unfinished, toggles)
		}
	}
	t.Logf("%d pauses and resumes", toggles)
	for _, id := range ids {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("context %d: %s at attempt %d, want DONE at 1", id, got.Status, got.Attempt)
		}
	}
	if m := running.finish(t)["etl"]; m > 3 {
		t.Errorf("saw %d tasks running at once, want at most max_running 3", m)
	}
	w.startedOnce(ids)
}

// A blocked kind keeps its submissions and starts none of them, shows the
// block and its reason, and starts them once unblocked; other kinds of the
// queue run meanwhile.
func TestBlockedKindKeepsItsTasks(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 4 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  loader: { queue: etl, command: ["{{sample}}"] }
`)
	for _, args := range [][]string{{"block", "loader"}, {"block", "loader", "--reason", " "}, {"block", "nosuchkind", "--reason", "x"}, {"pause", "nosuchqueue"},
		{"pause", "etl", "--reason", "bad \xff byte"}, {"block", "loader", "--reason", "bad \xfe byte"}, {"pause", "etl", "--reason", strings.Repeat("r", 2000)}} {
		res := w.Dama(w.cfg, args...)
		if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || res.Stdout != "" {
			t.Errorf("dama %v: exit %d, stdout %q, stderr %q; want one line on stderr and a failure", args, res.Code, res.Stdout, res.Stderr)
		}
	}
	stats, err := client.QueueStats(context.Background())
	if err != nil || len(stats) != 0 {
		t.Fatalf("a refused command wrote something: %+v, %v", stats, err)
	}
	res := w.Dama(w.cfg, "block", "loader", "--reason", "upstream sends bad files")
	if res.Code != 0 {
		t.Fatalf("block: %s", res.Stderr)
	}
	w.Start(w.cfg, "supervisor")
	blocked := []int64{w.submitKind(client, "loader", 1, 10, nil), w.submitKind(client, "loader", 1, 10, nil)}
	other := w.submitKind(client, "sample", 1, 10, nil)
	if got := w.waitSettled(other, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task of the kind not blocked: %s", got.Status)
	}
	for _, id := range blocked {
		w.waitFor(id, 20*time.Second, "to wait for its blocked kind", func(t etlcontext.Task) bool {
			return t.Status == etlcontext.StatusQueued && t.WaitingFor != nil && *t.WaitingFor == string(etlcontext.WaitKindBlocked)
		})
	}
	res = w.Dama(w.cfg, "status")
	if got := strings.Count(res.Stdout, "kind_blocked"); got != 2 {
		t.Errorf("dama status shows %d tasks waiting for their blocked kind, want 2:\n%s", got, res.Stdout)
	}
	res = w.Dama(w.cfg, "queues")
	if line := lineWith(res.Stdout, "loader"); !strings.Contains(line, `yes: "upstream sends bad files"`) || strings.Fields(line)[2] != "2" {
		t.Errorf("dama queues, want loader with 2 queued and its block:\n%s", res.Stdout)
	}
	var reason string
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT block_reason FROM data_manager.dama_queue_stats WHERE kind = 'loader' AND blocked`).Scan(&reason); err != nil || reason != "upstream sends bad files" {
		t.Errorf("dama_queue_stats block_reason %q, %v", reason, err)
	}
	res = w.Dama(w.cfg, "unblock", "loader")
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "kind loader unblocked" {
		t.Fatalf("unblock: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	for _, id := range blocked {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s after unblock", id, got.Status)
		}
	}
	w.startedOnce(append(blocked, other))
}

// A kind's max_running and its per-key bound hold across two supervisors,
// while different keys run side by side.
func TestKindAndKeyLimitsHoldAcrossSupervisors(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 10 }
kinds:
  serial: { queue: etl, max_running: 1, command: ["{{sample}}"] }
  regional: { queue: etl, concurrency_key: source.region, command: ["{{sample}}"] }
`)
	var ids []int64
	for range 5 {
		ids = append(ids, w.submitKind(client, "serial", 3, 40, nil))
	}
	for i := range 9 {
		region := []string{"eu", "us", "ap"}[i%3]
		ids = append(ids, w.submitKind(client, "regional", 3, 40, map[string]any{"source": map[string]any{"region": region}}))
	}
	if _, _, err := client.Submit(context.Background(), supervisor.SubmitParams{Kind: "regional", Args: json.RawMessage(`{"source": {}}`)}); err == nil || !strings.Contains(err.Error(), "source.region") {
		t.Errorf("a submission without the concurrency key: %v, want refused naming source.region", err)
	}
	perKey := w.sample(`
		SELECT kind || '/' || coalesce(concurrency_key, '-'), count(*) FROM data_manager.etl_contexts
		 WHERE etl_status = 'RUNNING' GROUP BY 1
		UNION ALL
		SELECT 'kind ' || kind, count(*) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING' GROUP BY kind`)
	w.Start(w.cfg, "supervisor")
	w.Start(w.cfg, "supervisor")
	for _, id := range ids {
		if got := w.waitSettled(id, 90*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s", id, got.Status)
		}
	}
	seen := perKey.finish(t)
	t.Logf("most running at once: %v", seen)
	if seen["kind serial"] != 1 {
		t.Errorf("saw %d serial tasks at once, want 1 (max_running 1)", seen["kind serial"])
	}
	for _, region := range []string{"eu", "us", "ap"} {
		if n := seen["regional/"+region]; n != 1 {
			t.Errorf("saw %d regional tasks of %s at once, want 1 (max_running_per_key 1)", n, region)
		}
	}
	if seen["kind regional"] < 2 {
		t.Errorf("saw at most %d regional tasks at once: different keys never ran side by side", seen["kind regional"])
	}
	w.startedOnce(ids)
}

// One kind with a thousand tasks waiting does not hold back another kind
// of the same queue (the seeds' head-of-line blocking), and the waiting
// tasks are parked: not fetched again at every poll.
//
// Both are counted in tasks started, not in seconds, and every wait is
// given time in proportion to the tasks it awaits: on a busy machine the
// steps that park the thousand tasks and the tasks themselves are all
// slower, and the counts hold all the same.
func TestBusyKindDoesNotStarveAnother(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 2 }
kinds:
  bulk: { queue: etl, command: ["{{sample}}"] }
  urgent: { queue: etl, command: ["{{sample}}"] }
`)
	const (
		bulk = 1000
		// perStep and perTask are generous allowances for one step that
		// parks a task (a few milliseconds when idle) and for one more
		// bulk task started (under a second when idle, with -race), on a
		// loaded machine: they only bound waits that would otherwise hang,
		// scaled by the steps or tasks awaited.
		perStep = 100 * time.Millisecond
		perTask = 5 * time.Second
		// fair is the most bulk tasks that may start between the urgent
		// task's submission and its start: those woken for a slot before
		// its step parked it, and a slot or two of slack. Unfair wakes
		// would start the hundreds of bulk tasks waiting ahead of it.
		fair = 20
	)
	batch := make([]string, bulk)
	for i := range batch {
		batch[i] = fmt.Sprintf(`{"steps": 1, "step_ms": 400, "n": %d}`, i)
	}
	// One statement per task through the Go API would take a while; a
	// transaction of them is what a loader would do.
	tx, err := w.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range batch {
		if _, _, err := client.SubmitTx(context.Background(), tx, supervisor.SubmitParams{Kind: "bulk", Args: json.RawMessage(args)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.Start(w.cfg, "supervisor")
	// bulkCounts reads, in one snapshot, the bulk tasks no step has looked
	// at yet, those waiting for a slot, and those started.
	bulkCounts := func() (unseen, waiting, started int) {
		t.Helper()
		if err := w.Pool.QueryRow(context.Background(), `
			SELECT count(*) FILTER (WHERE attempt = 0 AND waiting_for IS NULL AND etl_status = 'QUEUED'),
			       count(*) FILTER (WHERE waiting_for IS NOT NULL AND etl_status = 'QUEUED'),
			       count(*) FILTER (WHERE attempt > 0)
			  FROM data_manager.etl_contexts WHERE kind = 'bulk'`).Scan(&unseen, &waiting, &started); err != nil {
			t.Fatal(err)
		}
		return unseen, waiting, started
	}
	// Every bulk task has had its first step: it started, or it waits for
	// a slot. Two of them run meanwhile, so how many started by then
	// depends on how fast the steps go, and does not matter.
	parking := time.Now()
	testenv.Eventually(t, bulk*perStep, "every bulk task to start or wait for a slot", func() (bool, error) {
		unseen, waiting, started := bulkCounts()
		return unseen == 0, fmt.Errorf("%d not looked at yet, %d waiting, %d started", unseen, waiting, started)
	})
	_, waiting, started := bulkCounts()
	t.Logf("the bulk tasks' first steps took %s: %d waiting, %d started", time.Since(parking).Round(time.Millisecond), waiting, started)

	// Parked: over five poll intervals and while at least two rounds of
	// bulk tasks start (more time on a slower machine), the waiting jobs
	// are not fetched again, but for those woken by a freed slot.
	const window = 4
	var since time.Time
	if err := w.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	_, _, before := bulkCounts()
	testenv.Eventually(t, 5*300*time.Millisecond+window*perTask, fmt.Sprintf("five poll intervals and %d more bulk tasks started", window), func() (bool, error) {
		var elapsed time.Duration
		if err := w.Pool.QueryRow(context.Background(), `SELECT now() - $1`, since).Scan(&elapsed); err != nil {
			t.Fatal(err)
		}
		_, _, started := bulkCounts()
		return elapsed >= 5*300*time.Millisecond && started >= before+window, fmt.Errorf("%s passed, %d started since", elapsed, started-before)
	})
	var (
		refetched int
		elapsed   time.Duration
	)
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE j.attempted_at > $1), count(*) FILTER (WHERE c.started_at > $1), now() - $1
		  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.kind = 'bulk'`, since).Scan(&refetched, &started, &elapsed); err != nil {
		t.Fatal(err)
	}
	t.Logf("in %s: %d bulk jobs fetched, %d bulk tasks started", elapsed.Round(time.Millisecond), refetched, started)
	if refetched > 3*(started+2) {
		t.Errorf("%d waiting jobs fetched in %s while %d started: the waiting tasks are polled, not parked", refetched, elapsed.Round(time.Millisecond), started)
	}

	// The urgent task goes ahead of the hundreds of bulk tasks still
	// waiting: it starts before more than a few of them do.
	_, waiting, before = bulkCounts()
	if waiting < 10*fair {
		t.Fatalf("only %d bulk tasks wait: too few for a task going ahead of them to tell", waiting)
	}
	urgent := w.submitKind(client, "urgent", 1, 10, nil)
	var bulkStarted int
	// Unfair, it fails after fair+1 bulk starts; fair, it waits for at
	// most fair of them.
	testenv.Eventually(t, (fair+1)*perTask, "the urgent task to start", func() (bool, error) {
		var attempt int
		if err := w.Pool.QueryRow(context.Background(), `
			SELECT (SELECT attempt FROM data_manager.etl_contexts WHERE etl_context_id = $1),
			       (SELECT count(*) FROM data_manager.etl_contexts WHERE kind = 'bulk' AND attempt > 0)`,
			urgent).Scan(&attempt, &bulkStarted); err != nil {
			t.Fatal(err)
		}
		bulkStarted -= before
		if attempt == 0 && bulkStarted > fair {
			t.Fatalf("%d bulk tasks started after the urgent task was submitted, and it has not: want it started within a few slots, ahead of the %d bulk tasks waiting", bulkStarted, waiting)
		}
		return attempt > 0, fmt.Errorf("%d bulk tasks started since its submission", bulkStarted)
	})
	got := w.waitSettled(urgent, 30*time.Second)
	t.Logf("the urgent task waited %s, behind %d waiting bulk tasks, while %d bulk tasks started", got.StartedAt.Sub(got.CreatedAt).Round(time.Millisecond), waiting, bulkStarted)
	if got.Status != etlcontext.StatusDone {
		t.Errorf("the urgent task was %s, want DONE", got.Status)
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
	due := time.Now().Add(4 * time.Second).Truncate(time.Second)
	res := w.Dama(w.cfg, "submit", "sample", "--run-at", due.Format(time.RFC3339), "--args", `{"steps": 1, "step_ms": 1}`)
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	task := w.task(id)
	if task.Status != etlcontext.StatusQueued || task.DueAt == nil || !task.DueAt.Equal(due) {
		t.Fatalf("%s due %v, want QUEUED due %s", task.Status, deref(task.DueAt), due)
	}
	if out := w.Dama(w.cfg, "status", fmt.Sprint(id)).Stdout; !strings.Contains(out, "until "+due.Local().Format(time.DateTime)) {
		t.Errorf("dama status does not say when the task is due:\n%s", out)
	}
	var scheduled int
	if err := w.Pool.QueryRow(context.Background(), `SELECT scheduled FROM data_manager.dama_queue_stats WHERE kind = 'sample'`).Scan(&scheduled); err != nil || scheduled != 1 {
		t.Errorf("dama_queue_stats: %d scheduled (%v), want 1", scheduled, err)
	}
	got := w.waitSettled(id, 30*time.Second)
	if got.Status != etlcontext.StatusDone || got.StartedAt.Before(due) {
		t.Errorf("%s, started at %s; want DONE, started no earlier than %s", got.Status, got.StartedAt, due)
	}
}
