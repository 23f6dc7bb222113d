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
)

// quietScript reports progress until the test creates "quiet" in its
// directory, then goes quiet; "kill" stays quiet, "warn" goes on: log
// lines (no event) from A to B, quiet again until C, progress until D.
// With a checkpoint it reports it back (RESUMED) and succeeds.
const quietScript = `dir=$(dirname "$0")
emit() { printf '%s\n' "$1" >&3; }
until_file() { while [ ! -e "$dir/$1" ]; do sleep 0.05; done; }
talk_until() { n=0; while [ ! -e "$dir/$2" ]; do n=$((n+1)); emit "{\"type\":\"progress\",\"payload\":{\"phase\":$1,\"n\":$n}}"; sleep 0.1; done; }
if [ -n "$DAMA_CHECKPOINT" ] && [ "$DAMA_CHECKPOINT" != null ]; then
	emit "{\"type\":\"resumed\",\"payload\":$DAMA_CHECKPOINT}"
	exit 0
fi
emit '{"type":"checkpoint","payload":{"resume":"here"}}'
talk_until 1 quiet
[ "$1" = kill ] && until_file never
until_file A
while [ ! -e "$dir/B" ]; do echo awake; sleep 0.1; done
until_file C
talk_until 2 D
`

// TestAStalledTaskIsMarkedClearedAndKilled: a kind's stall_after marks a
// task whose command went quiet STALLED on time, though its supervisor was
// killed and another took over meanwhile; a log line or progress clears the
// mark, and on_stall kill stops the attempt, the next resuming from its
// checkpoint.
func TestAStalledTaskIsMarkedClearedAndKilled(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if err := os.WriteFile(filepath.Join(env.Dir, "quiet.sh"), []byte(quietScript), 0o755); err != nil {
		t.Fatal(err)
	}
	// progress_interval is left at its 10s: the progress held back when
	// the command went quiet is stored before its STALLED, not after.
	w := &world{Env: env, cfg: env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
kill_grace: 1s
kinds:
  quiet:
    command: ["/bin/sh", "{{dir}}/quiet.sh", "warn"]
    stall_after: 4s
    max_attempts: 1
  quiet_kill:
    command: ["/bin/sh", "{{dir}}/quiet.sh", "kill"]
    stall_after: 4s
    on_stall: kill
    max_attempts: 2
    retry: {backoff: fixed, delay: 1s}
`)}
	touch := func(name string) time.Time {
		t.Helper()
		if err := os.WriteFile(filepath.Join(env.Dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	events := func(id int64, suffix string) []etlcontext.Event {
		t.Helper()
		all, err := etlcontext.Events(context.Background(), env.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if suffix == "" {
			return all
		}
		var of []etlcontext.Event
		for _, e := range all {
			if strings.HasSuffix(e.Type, ":"+suffix) {
				of = append(of, e)
			}
		}
		return of
	}
	waitEvents := func(id int64, suffix string, n int) etlcontext.Event {
		t.Helper()
		var got []etlcontext.Event
		testenv.Eventually(t, 20*time.Second, "task "+strconv.FormatInt(id, 10)+" to have "+strconv.Itoa(n)+" "+suffix, func() (bool, error) {
			got = events(id, suffix)
			return len(got) >= n, nil
		})
		return got[n-1]
	}
	reason := func(id int64) string {
		t.Helper()
		res := w.Dama(w.cfg, "status", strconv.FormatInt(id, 10))
		if res.Code != 0 {
			t.Fatalf("dama status %d: exit %d: %s", id, res.Code, res.Stderr)
		}
		return lineWith(res.Stdout, "Reason:")
	}

	first := w.Start(w.cfg, "supervisor")
	warn, kill := w.submitOf("quiet"), w.submitOf("quiet_kill")
	// Reporting for longer than stall_after is no stall.
	for _, id := range []int64{warn, kill} {
		w.waitFor(id, 30*time.Second, "to report for longer than stall_after", func(t etlcontext.Task) bool {
			var p struct{ N int }
			return t.Progress != nil && json.Unmarshal(t.Progress, &p) == nil && p.N >= 50
		})
	}

	quietFrom := touch("quiet")
	// A crash while the tasks are quiet: the task processes count on.
	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the supervisor to die", func() (bool, error) {
		return !testenv.Alive(first.Cmd.Process.Pid), nil
	})
	killed := time.Now()
	w.Start(w.cfg, "supervisor")

	// The command reports every 100ms, and may have last reported so
	// long before it was told to stop; a loaded machine writes late, but
	// never early.
	onTime := func(id int64, e etlcontext.Event, from time.Time) {
		t.Helper()
		// created_at is the start of the transaction that wrote it, which
		// a batch of the task process's writes on a loaded machine may
		// have begun a few tenths before.
		if late := e.CreatedAt.Sub(from); late < 3500*time.Millisecond || late > 20*time.Second {
			t.Errorf("task %d: STALLED %s after it went quiet, want 4s (a few tenths more)", id, late)
		}
	}
	for _, id := range []int64{warn, kill} {
		stalled := waitEvents(id, "STALLED", 1)
		onTime(id, stalled, quietFrom)
		if !stalled.CreatedAt.After(killed) {
			t.Fatalf("task %d was marked stalled before its supervisor was killed, %s after it went quiet: the test proves nothing", id, killed.Sub(quietFrom))
		}
	}

	// on_stall kill: the attempt ends as timed out, the next resumes from
	// its checkpoint, while the other task stays marked.
	got := w.waitSettled(kill, 30*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("the task killed for its stall is %s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	if e := events(kill, "ERROR"); len(e) != 1 || !strings.Contains(string(e[0].Payload), `"reason": "stalled: no progress for 4s, last at `) ||
		!strings.Contains(string(e[0].Payload), `"timed_out": true`) || e[0].Attempt != 1 {
		t.Errorf("the stalled attempt's ERROR: %v", e)
	}
	if e := events(kill, "RESUMED"); len(e) != 1 || string(e[0].Payload) != `{"resume": "here"}` || e[0].Attempt != 2 {
		t.Errorf("the second attempt's RESUMED: %v; want the first's checkpoint", e)
	}

	// Marked, though the task process wrote its own line to the log; the
	// progress held back when the command went quiet stored before.
	if n := len(events(warn, "UNSTALLED")); n != 0 {
		t.Errorf("the quiet task was unmarked %d times before reporting again", n)
	}
	task := w.task(warn)
	if r := reason(warn); task.Stalled == nil || !strings.Contains(r, "stalled: no progress for 4s, last at ") {
		t.Errorf("the quiet task: stalled %s, %s", task.Stalled, r)
	}
	stats, err := etlcontext.QueueStats(context.Background(), env.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Kind != nil && *s.Kind == "quiet" && s.Stalled != 1 {
			t.Errorf("dama_queue_stats counts %d stalled tasks of quiet, want 1", s.Stalled)
		}
	}
	marked := false
	for _, e := range events(warn, "") {
		marked = marked || strings.HasSuffix(e.Type, ":STALLED")
		if marked && strings.Contains(string(e.Payload), `"phase": 1`) {
			t.Errorf("%s %s stored after the STALLED mark", e.Type, e.Payload)
		}
	}

	// A log line clears the mark; quiet again, it is marked again; then
	// progress clears it.
	touch("A")
	waitEvents(warn, "UNSTALLED", 1)
	if task := w.task(warn); task.Stalled != nil {
		t.Errorf("the task reports in its log and is still marked: %s", task.Stalled)
	}
	quietAgain := touch("B")
	onTime(warn, waitEvents(warn, "STALLED", 2), quietAgain)
	touch("C")
	waitEvents(warn, "UNSTALLED", 2)
	if task, r := w.task(warn), reason(warn); task.Stalled != nil || strings.Contains(r, "stalled") {
		t.Errorf("the task reports progress and is still marked: %s, %s", task.Stalled, r)
	}
	touch("D")
	if got := w.waitSettled(warn, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("the quiet task is %s after %d attempts, want DONE after 1: warn does not stop it", got.Status, got.Attempt)
	}
}
