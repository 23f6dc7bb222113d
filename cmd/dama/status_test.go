package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// etaRE is the time a running task's progress says it has left.
var etaRE = regexp.MustCompile(`\d+% \d+/\d+\s+ETA (?:(\d+)m)?(\d+)s`)

// dama status draws a task's progress as a bar with its percentage and,
// while it runs, the time it has left at its pace, and how long it has
// run; once it is DONE, the whole bar and how long it took.
func TestStatusDrawsProgressAndTimeLeft(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(terminalConfig)
	env.Start(cfg, "supervisor")
	w := &world{Env: env, cfg: cfg}
	// 200 steps of 150ms: 30 s in all, of which the test looks during
	// the 4.5 s to 18 s.
	id := testenv.Atoi(t, env.Dama(cfg, "submit", "sample", "--args", sampleArgs(t, 200, 150, nil)).Stdout)
	w.waitFor(id, 30*time.Second, "to report progress over two seconds", func(t etlcontext.Task) bool {
		p, ok := etlcontext.ParseProgress(t.Progress)
		return ok && p.Fraction >= 0.15 && p.Fraction < 0.6
	})
	var row string
	testenv.Eventually(t, 10*time.Second, "dama status to show the time left", func() (bool, error) {
		row = lineWith(env.Dama(cfg, "status", "-o", "wide", strconv.FormatInt(id, 10)).Stdout, "RUNNING")
		return etaRE.MatchString(row), nil
	})
	// Its steps sleep 150ms each: at its pace, even on a slow machine,
	// what is left takes seconds, not minutes.
	m := etaRE.FindStringSubmatch(row)
	minutes, _ := strconv.Atoi(m[1])
	seconds, _ := strconv.Atoi(m[2])
	if left := 60*minutes + seconds; left < 1 || left > 120 {
		t.Errorf("a task with 30 s of work, part done: %ds left in %q, want 1 to 120", left, row)
	}
	if !regexp.MustCompile(`\s(\d+m)?\d+s\s+sample:`).MatchString(row) || !regexp.MustCompile(`\[#+\.+\]`).MatchString(row) {
		t.Errorf("the running task's row %q: want how long it has run, in seconds, and a bar", row)
	}
	// The default table: the bar, its percentage and the time left.
	if short := lineWith(env.Dama(cfg, "status").Stdout, strconv.FormatInt(id, 10), "RUNNING"); !etaRE.MatchString(short) || !regexp.MustCompile(`\[#+\.+\]`).MatchString(short) {
		t.Errorf("the running task's row in the default table %q: want a bar and the time left", short)
	}
	w.waitSettled(id, time.Minute)
	row = lineWith(env.Dama(cfg, "status", "-o", "wide", strconv.FormatInt(id, 10)).Stdout, "DONE")
	if !regexp.MustCompile(`\s([3-5]\ds|\d+m\d+s)\s+sample:FINAL \d\d:\d\d:\d\d \S+\s+\[#{20}\] 100% 200/200\s+-$`).MatchString(row) {
		t.Errorf("the finished task's row %q: want it took 30 s or more, its FINAL's local time, a full bar, and no time left", row)
	}
}

// A kind whose command this host does not have says so: once in the
// supervisor's log when it starts, once when a launch fails for it, and in
// the task's reason in dama status, which fits 80 columns.
func TestAKindThatCannotRunHereSaysWhy(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	cfg := w.WriteConfig(sampleConfigFor(2) + `
  broken:
    queue: etl
    command: ["/nonexistent/etl-tool"]
`)
	sup := w.Start(cfg, "supervisor")
	sup.WaitReady(t, time.Minute)
	id := testenv.Atoi(t, w.Dama(cfg, "submit", "broken").Stdout)
	// Tried at each poll, launched once: its task process said why.
	testenv.Eventually(t, time.Minute, "the supervisor to try the task three times", w.tried(id, 3))
	out, err := os.ReadFile(sup.Log)
	if err != nil {
		t.Fatal(err)
	}
	log := string(out)
	if n := strings.Count(log, `msg="spawned task process" etl_context_id=`+strconv.FormatInt(id, 10)); n != 1 {
		t.Errorf("%d task processes started for a task this host said it cannot run, want one:\n%s", n, log)
	}
	said := map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			said[line[strings.Index(line, "level="):min(len(line), strings.Index(line, "level=")+60)]]++
		}
	}
	if len(said) != 2 || !strings.Contains(log, `msg="this host cannot run a kind's command: its tasks wait for a host that can" kind=broken error="/nonexistent/etl-tool not found"`) ||
		!strings.Contains(log, `reason="this host cannot run the task: /nonexistent/etl-tool not found"`) {
		t.Errorf("the supervisor's warnings and errors, want one at its start and one for the launch:\n%v\n%s", said, log)
	}
	for _, n := range said {
		if n != 1 {
			t.Errorf("a warning or error said %d times, want once:\n%v", n, said)
		}
	}
	// Between a launch and its taking back the task is RUNNING.
	var res testenv.Result
	testenv.Eventually(t, time.Minute, "dama status to say why the task waits", func() (bool, error) {
		res = w.DamaWith(cfg, []string{"COLUMNS=200"}, "status")
		return regexp.MustCompile(`QUEUED .* waiting: /nonexistent/etl-tool not found on host \S+ since \d\d:\d\d:\d\d \S+$`).MatchString(lineWith(res.Stdout, "broken")), fmt.Errorf("dama status:\n%s", res.Stdout)
	})
	testenv.Eventually(t, time.Minute, "dama status in 80 columns to show the progress and the reason", func() (bool, error) {
		res = w.DamaWith(cfg, []string{"COLUMNS=80"}, "status")
		return strings.Contains(res.Stdout, "PROGRESS") && strings.Contains(res.Stdout, "waiting: /nonexistent/"), fmt.Errorf("dama status:\n%s", res.Stdout)
	})
	for _, line := range strings.Split(strings.TrimSuffix(res.Stdout, "\n"), "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("a line of %d columns with COLUMNS=80: %q", n, line)
		}
	}

	// Cancelled, it never ran: no start, no run time, though its launches
	// were tried.
	if res := w.Dama(cfg, "cancel", strconv.FormatInt(id, 10)); res.Code != 0 {
		t.Fatalf("dama cancel: exit %d: %s", res.Code, res.Stderr)
	}
	w.waitSettled(id, time.Minute)
	shown := w.Dama(cfg, "status", strconv.FormatInt(id, 10)).Stdout
	if !regexp.MustCompile(`(?m)^Started: +-$`).MatchString(shown) || !regexp.MustCompile(`(?m)^Ran for: +-$`).MatchString(shown) {
		t.Errorf("the cancelled task that never ran, in dama status ID: want no start and no run time:\n%s", shown)
	}
	if row := lineWith(w.DamaWith(cfg, []string{"COLUMNS=200"}, "status").Stdout, "broken"); !regexp.MustCompile(`CANCELLED +0/\d+ +- +- +-$`).MatchString(row) {
		t.Errorf("the cancelled task that never ran: row %q, want no time", row)
	}
}

// JOB never contradicts STATUS, in the view, the table and --json: a
// running task's job is running, a task due later has its job scheduled,
// one waiting in a paused queue available (River has it parked,
// 'scheduled' an hour ahead), a retrying one's waits out its backoff,
// which due_at and the reason show, and a finished one's is River's final
// word; --json has no scheduled_at.
func TestTheJobAgreesWithTheStatus(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(strings.Replace(sampleConfigFor(2), "queues:\n", "queues:\n  held: {max_running: 1}\n", 1) + `
  patient:
    queue: etl
    command: ["{{sample}}"]
    retry: {delay: 1h, backoff: fixed}
  held:
    queue: held
    command: ["{{sample}}"]
`)
	w := &world{Env: env, cfg: cfg}
	env.Start(cfg, "supervisor").WaitReady(t, time.Minute)
	if res := env.Dama(cfg, "pause", "held"); res.Code != 0 {
		t.Fatalf("dama pause held: exit %d: %s", res.Code, res.Stderr)
	}
	// Runs for as long as the test looks.
	running := w.submitOf("sample", "--args", sampleArgs(t, 1, 100, map[string]any{"until_file": filepath.Join(env.Dir, "never")}))
	later := w.submitOf("sample", "--delay", "1h")
	paused := w.submitOf("held")
	retrying := w.submitOf("patient", "--args", sampleArgs(t, 2, 10, map[string]any{"fail_at": 1}))
	done := w.submitOf("sample", "--args", sampleArgs(t, 1, 10, nil))
	w.waitRunning(running)
	w.waitFor(retrying, time.Minute, "to wait for its retry", func(t etlcontext.Task) bool { return t.Status == etlcontext.StatusRetrying })
	w.waitSettled(done, time.Minute)
	// The paused queue's task has been looked at: it waits for the queue.
	w.waitFor(paused, time.Minute, "to wait for its queue", func(t etlcontext.Task) bool { return t.WaitingFor != nil })

	want := map[int64]string{running: "running", later: "scheduled", paused: "available", retrying: "retryable", done: "completed"}
	var shown []map[string]any
	if err := json.Unmarshal([]byte(env.Dama(cfg, "status", "--json").Stdout), &shown); err != nil {
		t.Fatal(err)
	}
	for _, task := range shown {
		id := int64(task["etl_context_id"].(float64))
		if task["job_state"] != want[id] {
			t.Errorf("task %d %s: job_state %v in --json, want %s", id, task["etl_status"], task["job_state"], want[id])
		}
		if _, ok := task["scheduled_at"]; ok {
			t.Errorf("task %d: --json shows River's scheduled_at, the parked job's: %v", id, task["scheduled_at"])
		}
	}
	rows := map[string]string{}
	for _, line := range strings.Split(env.Dama(cfg, "status", "-o", "wide").Stdout, "\n") {
		id, _, _ := strings.Cut(line, " ")
		rows[id] = line
	}
	for id, job := range want {
		if row := rows[strconv.FormatInt(id, 10)]; !strings.Contains(row, " "+job+" ") {
			t.Errorf("task %d in -o wide: %q, want JOB %s", id, row, job)
		}
	}
	r := w.task(retrying)
	if r.DueAt == nil || time.Until(*r.DueAt) < 50*time.Minute {
		t.Errorf("the retrying task is due at %v, want its backoff's end, an hour from now", r.DueAt)
	}
	// It leads with its error, the command's last line standing in for the
	// failure line it did not write.
	if row := lineWith(env.Dama(cfg, "status").Stdout, "RETRYING"); !regexp.MustCompile(`RETRYING .* exit 3: failing at step 1 as asked, retry in \d+m\d+s$`).MatchString(row) {
		t.Errorf("the retrying task's row %q: want its error, and when it is retried", row)
	}
	described := env.Dama(cfg, "status", strconv.FormatInt(retrying, 10)).Stdout
	if !regexp.MustCompile(`patient:ERROR +exit 3: failing at step 1 as asked \(and the log's last \d+ lines\)\n`).MatchString(described) || strings.Contains(described, etlcontext.TruncatedKey) {
		t.Errorf("dama status %d: want its ERROR event in a line:\n%s", retrying, described)
	}
}

// dama status, and the page's All tab, list the running tasks first, then
// the retrying, then the queued, then the finished, each newest first: a
// burst of short tasks never pushes a running one out of view. --status
// lists newest first; the page's next pages on in the same order.
func TestActiveTasksComeFirst(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.Start(w.cfg, "supervisor").WaitReady(t, time.Minute)
	running := w.submitHeld(1, 10)
	w.waitRunning(running)
	var done []int64
	for range 4 {
		id := w.submit(1, 10)
		w.waitSettled(id, time.Minute)
		done = append(done, id)
	}
	var queued []int64
	for range 2 {
		queued = append(queued, testenv.Atoi(t, w.Dama(w.cfg, "submit", "sample", "--delay", "1h").Stdout))
	}
	ids := func(out string) []int64 {
		var got []int64
		for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			id, _, _ := strings.Cut(line, " ")
			got = append(got, testenv.Atoi(t, id))
		}
		return got
	}
	want := []int64{running, queued[1], queued[0], done[3]}
	if got := ids(w.Dama(w.cfg, "status", "--limit", "4").Stdout); !slices.Equal(got, want) {
		t.Errorf("dama status --limit 4: %v, want the running, the queued, then the newest finished: %v", got, want)
	}
	if got := ids(w.Dama(w.cfg, "status", "--status", "DONE,QUEUED", "--limit", "3").Stdout); !slices.Equal(got, []int64{queued[1], queued[0], done[3]}) {
		t.Errorf("dama status --status DONE,QUEUED: %v, want newest first", got)
	}

	_, base := startWeb(t, w.Env, w.cfg, []string{webTokenEnv + "=" + webToken}, "--public-reads")
	page := func(query string) []int64 {
		code, v := call(t, "GET", base+"api/tasks"+query, nil, "")
		list, ok := v["tasks"].([]any)
		if !ok {
			t.Fatalf("GET api/tasks%s: %d %v", query, code, v)
		}
		var got []int64
		for _, x := range list {
			got = append(got, int64(x.(map[string]any)["etl_context_id"].(float64)))
		}
		return got
	}
	all := append([]int64{running, queued[1], queued[0]}, done[3], done[2], done[1], done[0])
	if got := page(""); !slices.Equal(got, all) {
		t.Errorf("GET api/tasks: %v, want %v", got, all)
	}
	if got, want := page(fmt.Sprintf("?before=QUEUED:%d", queued[1])), all[2:]; !slices.Equal(got, want) {
		t.Errorf("GET api/tasks?before=QUEUED:%d: %v, want %v", queued[1], got, want)
	}
	if got, want := page(fmt.Sprintf("?before=DONE:%d", done[2])), []int64{done[1], done[0]}; !slices.Equal(got, want) {
		t.Errorf("GET api/tasks?before=DONE:%d: %v, want %v", done[2], got, want)
	}
	w.release()
}
