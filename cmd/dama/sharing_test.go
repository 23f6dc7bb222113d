package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestTwoSupervisorsShareTheQueueWithinMaxRunning(t *testing.T) {
	t.Parallel()
	const maxRunning = 3
	w := newWorld(t, maxRunning)
	var ids []int64
	for range 12 {
		ids = append(ids, w.submit(6, 60))
	}

	// Sample the number of running tasks while two supervisors work.
	stop := make(chan struct{})
	var (
		mu         sync.Mutex
		maxSeen    int
		sampleErr  error
		sampleDone = make(chan struct{})
	)
	go func() {
		defer close(sampleDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var n int
			err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING'`).Scan(&n)
			mu.Lock()
			if err != nil && sampleErr == nil {
				sampleErr = err
			}
			maxSeen = max(maxSeen, n)
			mu.Unlock()
		}
	}()
	w.Start(w.cfg, "supervisor")
	w.Start(w.cfg, "supervisor")
	for _, id := range ids {
		if got := w.waitSettled(id, 90*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s", id, got.Status)
		}
	}
	close(stop)
	<-sampleDone
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	if maxSeen > maxRunning || maxSeen == 0 {
		t.Errorf("saw %d tasks running at once, want between 1 and max_running %d", maxSeen, maxRunning)
	}
	for _, id := range ids {
		if starts := w.starts(id); len(starts) != 1 {
			t.Errorf("context %d started %d times: %v", id, len(starts), starts)
		}
	}
}

func TestFreedSlotIsTakenWithoutWaitingForThePoll(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 60s
queues:
  one: { max_running: 1 }
kinds:
  sample:
    queue: one
    command: ["{{sample}}"]
`)
	w := &world{Env: env, cfg: cfg, startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.Start(cfg, "supervisor")
	// Held running until the second is queued behind it.
	first := w.submitHeld(10, 100)
	w.waitRunning(first)
	second := w.submit(10, 100)
	w.release()
	// The second task is snoozed for the 60s poll interval while the queue is
	// full; only the wake on the first task's exit starts it sooner.
	for _, id := range []int64{first, second} {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
			t.Fatalf("context %d: %s", id, got.Status)
		}
	}
}

func TestSupervisorLeavesKindsItDoesNotRunToOthers(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	narrow := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
queues: { etl: {} }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
`)
	wide := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
queues: { etl: {} }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  other: { queue: etl, command: ["/bin/true"] }
`)
	w := &world{Env: env, cfg: wide}
	narrowSup := env.Start(narrow, "supervisor")
	res := env.Dama(wide, "submit", "other")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	testenv.Eventually(t, 20*time.Second, "the narrow supervisor to pass the task over", func() (bool, error) {
		log, err := os.ReadFile(narrowSup.Log)
		return strings.Contains(string(log), "leaving the task to another supervisor"), err
	})
	if got := w.task(id); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
		t.Fatalf("a supervisor without the kind touched the task: %s, attempt %d", got.Status, got.Attempt)
	}
	env.Start(wide, "supervisor")
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
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
	if _, _, err := client.Submit(context.Background(), dama.SubmitParams{Kind: "regional", Args: json.RawMessage(`{"source": {}}`)}); err == nil || !strings.Contains(err.Error(), "source.region") {
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

// One kind with hundreds of tasks waiting does not hold back another kind
// of the same queue (the seeds' head-of-line blocking), and the waiting
// tasks are parked: not fetched again at every poll.
//
// Both are counted in tasks started, not in seconds, and every wait is
// given time in proportion to the tasks it awaits: on a busy machine the
// steps that park the hundreds of tasks and the tasks themselves are all
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
		bulk = 300
		// perTask is a generous allowance for one more bulk task started
		// (under a second when idle, with -race) on a loaded machine: it
		// only bounds waits that would otherwise hang, scaled by the
		// tasks awaited.
		perTask = 15 * time.Second
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
		if _, _, err := client.SubmitTx(context.Background(), tx, dama.SubmitParams{Kind: "bulk", Args: json.RawMessage(args)}); err != nil {
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
	testenv.Drains(t, 30*time.Second, "every bulk task to start or wait for a slot", func() (int, error) {
		unseen, waiting, started := bulkCounts()
		return unseen, fmt.Errorf("%d not looked at yet, %d waiting, %d started", unseen, waiting, started)
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
