package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// floodScript writes n named events, each followed by a progress line, as
// fast as the pipe takes them, once the file go exists, then exits 0.
func floodScript(n int, goFile string) string {
	return `while [ ! -e ` + goFile + ` ]; do sleep 0.2; done
seq 1 ` + strconv.Itoa(n) + ` | sed 's/.*/{"type":"rows","payload":{"n":&}}\
{"type":"progress","payload":{"step":&,"of":` + strconv.Itoa(n) + `}}/' >&3`
}

// checkFloodStored fails unless the task is DONE at attempt 1 with each of
// the n named events stored once, in order, and its newest progress.
func checkFloodStored(t *testing.T, w *world, id int64, n int, timeout time.Duration) {
	t.Helper()
	got := w.waitSettled(id, timeout)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s at attempt %d, want DONE at attempt 1", got.Status, got.Attempt)
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	next, progress, finals := 1, 0, 0
	var lastProgress string
	for _, e := range events {
		switch e.Type {
		case "flood:ROWS":
			var p struct{ N int }
			if err := json.Unmarshal(e.Payload, &p); err != nil || p.N != next {
				t.Fatalf("ROWS event %s where row %d was due", e.Payload, next)
			}
			next++
		case "flood:PROGRESS":
			progress++
			lastProgress = string(e.Payload)
		case "flood:FINAL":
			finals++
		case "flood:ERROR", "flood:WARNING":
			t.Fatalf("%s %s %s", e.Type, e.Payload, e.Meta)
		}
	}
	if next != n+1 || finals != 1 {
		t.Errorf("%d ROWS events and %d FINAL stored, want %d and 1", next-1, finals, n)
	}
	if want := `{"of": ` + strconv.Itoa(n) + `, "step": ` + strconv.Itoa(n) + `}`; lastProgress != want {
		t.Errorf("newest PROGRESS %s, want %s", lastProgress, want)
	}
	t.Logf("%d named events stored once, %d of %d progress lines kept (the rest coalesced)", next-1, progress, n)
}

// startFlood starts a supervisor of a kind "flood" (floodScript of n
// lines, settings added to the configuration) and submits one task of it:
// its command waits for the file goFile, and floods once it exists.
func startFlood(t *testing.T, env *testenv.Env, n int, settings string) (w *world, id int64, goFile string) {
	t.Helper()
	goFile = filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
` + settings + `
kinds:
  flood:
    command: ["/bin/sh", "-c", ` + strconv.Quote(floodScript(n, goFile)) + `]
    max_attempts: 3
`)
	w = &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	return w, w.submitOf("flood"), goFile
}

// A command that writes far more, far faster, than the database takes is
// made to wait on its pipe: no event is dropped and the task is DONE once.
func TestABurstOfEventsLosesNothing(t *testing.T) {
	testenv.LockModes(t, testABurstOfEventsLosesNothing)
}

func testABurstOfEventsLosesNothing(t *testing.T) {
	// Far beyond what the task process reads ahead (maxPendingEvents, 1,000)
	// and the pipe holds (64 KiB, some 1,500 lines).
	const n = 5000 // and as many progress lines: 10,000 in all
	w, id, goFile := startFlood(t, testenv.New(t), n, "")
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checkFloodStored(t, w, id, n, 5*time.Minute)
}

// The same flood while the database is down, within reconnect_grace: the
// command waits on its pipe through the outage.
func TestAFloodDuringAnOutageLosesNothing(t *testing.T) {
	testenv.LockModes(t, testAFloodDuringAnOutageLosesNothing)
}

func testAFloodDuringAnOutageLosesNothing(t *testing.T) {
	srv := testenv.NewServer(t)
	const n = 5000
	env := testenv.NewOn(t, srv)
	// The writer under backpressure, through an outage: watched for races.
	env.WithRaceDetector()
	w, id, goFile := startFlood(t, env, n, "heartbeat_interval: 200ms\nreconnect_grace: 2m")
	pgid := *w.waitFor(id, 30*time.Second, "to start its command", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.InitialEventLocked && t.CommandPGID != nil
	}).CommandPGID
	srv.Stop(t, "fast")
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The outage lasts until it holds the flood back: the task process,
	// which cannot write, stopped reading at its bounds, and the command
	// waits to write.
	testenv.Eventually(t, time.Minute, "the events pipe to fill up", func() (bool, error) {
		return pipeFull(pgid, 3) // the command's shell, whose fd 3 is the pipe
	})
	srv.Start(t)
	checkFloodStored(t, w, id, n, 5*time.Minute)
}

// pipeFull reports whether the pipe that is file descriptor fd of process
// pid has no room for another atomic write (PIPE_BUF, 4096 bytes on
// Linux): a writer of it waits until it is read.
func pipeFull(pid, fd int) (bool, error) {
	// A descriptor of our own on the pipe, which writes nothing.
	p, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(p)
	unread, err := unix.IoctlGetInt(p, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return false, fmt.Errorf("bytes unread in the pipe: %w", err)
	}
	capacity, err := unix.FcntlInt(uintptr(p), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return false, fmt.Errorf("the pipe's capacity: %w", err)
	}
	return capacity-unread < 4096, fmt.Errorf("%d of %d bytes unread", unread, capacity)
}

// Whatever bytes a command writes, to its log or its pipe, its outcome is
// the one its exit code and its kind's policy give, and its events are
// stored with the bytes the database refuses replaced.
func TestOddBytesChangeNoOutcome(t *testing.T) { testenv.LockModes(t, testOddBytesChangeNoOutcome) }

func testOddBytesChangeNoOutcome(t *testing.T) {
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  nul_log:
    command: ["/bin/sh", "-c", "printf 'x\\000y\\377z\\n'; exit 2"]
    max_attempts: 3
    fail_on_exit_codes: [2]
  odd_events:
    command: ["/bin/sh", "-c", "printf '{\"type\":\"rows\",\"payload\":{\"a\":\"x\\\\u0000y\",\"b\\\\u0000\":\"\\377\\376\",\"c\":\"\\\\ud800\",\"d\":1e999999}}\\n' >&3; printf '{\"type\":\"failure\",\"payload\":{\"error\":\"bad\\\\u0000row\",\"retry\":false}}\\n' >&3; exit 3"]
    max_attempts: 3
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	submit := func(kind string) int64 {
		res := w.Dama(cfg, "submit", kind)
		if res.Code != 0 {
			t.Fatalf("submit %s: %s", kind, res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}
	nulLog, oddEvents := submit("nul_log"), submit("odd_events")

	for _, id := range []int64{nulLog, oddEvents} {
		if got := w.waitFinished(id, time.Minute); got.Status != etlcontext.StatusFailed || got.Attempt != 1 {
			t.Errorf("context %d: %s at attempt %d, want FAILED at attempt 1 (no retry by its policy)", id, got.Status, got.Attempt)
		}
	}
	byType := func(id int64) map[string][]etlcontext.Event {
		events, err := etlcontext.Events(context.Background(), w.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string][]etlcontext.Event{}
		for _, e := range events {
			_, suffix, _ := strings.Cut(e.Type, ":")
			m[suffix] = append(m[suffix], e)
		}
		return m
	}

	got := byType(nulLog)
	if len(got["ERROR"]) != 1 || !strings.Contains(string(got["ERROR"][0].Payload), "x\ufffdy\ufffdz") {
		t.Errorf("nul_log's ERROR %v, want one with the log tail x\\ufffdy\\ufffdz", got["ERROR"])
	}
	if len(got["WARNING"]) != 1 || !strings.Contains(string(got["WARNING"][0].Meta), "1 NUL character, 1 invalid UTF-8 sequence") {
		t.Errorf("nul_log's WARNING %v, want one saying what was replaced", got["WARNING"])
	}

	got = byType(oddEvents)
	if len(got["ROWS"]) != 1 {
		t.Fatalf("odd_events stored %d ROWS events, want 1", len(got["ROWS"]))
	}
	var rows map[string]any
	if err := json.Unmarshal(got["ROWS"][0].Payload, &rows); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"a": "x\ufffdy", "b\ufffd": "\ufffd", "c": "\ufffd", "d": "1e999999"}
	for k, v := range want {
		if rows[k] != v {
			t.Errorf("ROWS payload %s: %s is %v, want %v", got["ROWS"][0].Payload, k, rows[k], v)
		}
	}
	if len(got["ERROR"]) != 1 || !strings.Contains(string(got["ERROR"][0].Payload), "bad\ufffdrow") {
		t.Errorf("odd_events' ERROR %v, want the failure's reason, cleaned", got["ERROR"])
	}
	// One WARNING stands for the replacements noted until it is written:
	// the failure line's may come in a second one.
	var said string
	for _, e := range got["WARNING"] {
		said += string(e.Meta)
	}
	if n := len(got["WARNING"]); n < 1 || n > 2 || !strings.Contains(said, "NUL") || !strings.Contains(said, "ROWS") {
		t.Errorf("odd_events' WARNINGs %s, want one or two saying what was replaced", said)
	}
}

// A server that refuses writes for a while (read-only for a switchover)
// loses none of a flood's events: the writes are kept and tried again, and
// the task is DONE once.
func TestAReadOnlySpellLosesNothing(t *testing.T) {
	t.Parallel()
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	const n = 3000
	w, id, goFile := startFlood(t, env, n, "")
	w.waitRunning(id)
	ctx := context.Background()
	setReadOnly := func(on bool) {
		t.Helper()
		stmt := `ALTER SYSTEM SET default_transaction_read_only = on`
		if !on {
			stmt = `ALTER SYSTEM RESET default_transaction_read_only`
		}
		if _, err := env.Pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Pool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	taskLog := filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id))
	testenv.Eventually(t, time.Minute, "the task process to meet the read-only server", func() (bool, error) {
		log, err := os.ReadFile(taskLog)
		return strings.Contains(string(log), "read-only transaction"), err
	})
	setReadOnly(false)
	checkFloodStored(t, w, id, n, 5*time.Minute)
}

// A process outside the attempt that writes to the events pipe, faster
// than the database stores, does not keep the task from ending: once the
// command's processes are gone, the task process reads no more than the
// pipe can hold. (No process the command starts can be outside the
// attempt, whatever group or session it moves to: the task process is its
// subreaper. The writer here is the test itself, which opens the command's
// pipe through /proc.)
func TestAnEscapedWriterDoesNotHoldTheTaskOpen(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  leaky:
    command: ["/bin/sh", "-c", "echo $$ > \"$0/pid\"; while [ ! -e \"$0/go\" ]; do sleep 0.2; done", "{{dir}}"]
    max_attempts: 1
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "leaky")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	var pid int
	testenv.Eventually(t, time.Minute, "the command to start", func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(env.Dir, "pid"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0, err
	})
	pipe, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/3", pid), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		line := []byte(`{"type":"rows","payload":{"n":1}}` + "\n")
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := pipe.Write(line); err != nil {
				return // the task process closed its end
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		pipe.Close()
		<-stopped
	})
	if err := os.WriteFile(filepath.Join(env.Dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := w.waitSettled(id, 2*time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("%s at attempt %d, want DONE at attempt 1", got.Status, got.Attempt)
	}
	events, err := etlcontext.Events(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	said := false
	for _, e := range events {
		said = said || (e.Type == "leaky:WARNING" && strings.Contains(string(e.Meta), "escaped the attempt"))
	}
	if !said {
		log, _ := os.ReadFile(filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id)))
		t.Errorf("no WARNING says that a process outside the attempt writes to the pipe; %d events; the task's log:\n%s", len(events), log)
	}
}

// A task that reports its progress and checkpoint 100 times a second
// stores a sample of them, one of each per progress_interval (here an
// hour: the first, and the newest before its outcome), while the view
// follows its newest progress within a second.
func TestProgressIsSampled(t *testing.T) { testenv.LockModes(t, testProgressIsSampled) }

func testProgressIsSampled(t *testing.T) {
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	// 300 lines of each, 10 ms apart, then the command waits for goFile.
	script := `i=1; while [ $i -le 300 ]; do
  printf '{"type":"progress","payload":{"step":%d,"of":300}}\n{"type":"checkpoint","payload":{"next":%d}}\n' $i $i >&3
  sleep 0.01; i=$((i+1))
done
while [ ! -e ` + goFile + ` ]; do sleep 0.2; done`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
progress_interval: 1h
kinds:
  chatty:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("chatty")
	last := `{"of": 300, "step": 300}`
	// No PROGRESS event carries it before the outcome: the task process
	// sets it on the context.
	w.waitFor(id, time.Minute, "the view to show the newest progress", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && string(t.Progress) == last
	})
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("%s, want DONE", got.Status)
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range events {
		switch e.Type {
		case "chatty:PROGRESS", "chatty:CHECKPOINT":
			got = append(got, e.Type+" "+string(e.Payload))
		case "chatty:FINAL":
			got = append(got, e.Type)
		}
	}
	want := []string{
		`chatty:PROGRESS {"of": 300, "step": 1}`, `chatty:CHECKPOINT {"next": 1}`,
		`chatty:PROGRESS {"of": 300, "step": 300}`, `chatty:CHECKPOINT {"next": 300}`, "chatty:FINAL",
	}
	if !slices.Equal(got, want) {
		t.Errorf("stored of 300 lines of each:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
