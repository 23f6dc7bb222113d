package main

import (
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

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
	// A live worker beats every 100ms.
	if !testenv.Holds(300*time.Millisecond, func() bool { return slices.Max(w.beats(id)[1]) == last }) {
		t.Errorf("the worker of attempt 1 still runs after the task finished")
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
