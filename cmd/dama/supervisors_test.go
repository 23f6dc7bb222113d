package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// supervisors is what dama supervisors --json says.
func (w *world) supervisors() []etlcontext.Supervisor {
	w.T.Helper()
	res := w.Dama(w.cfg, "supervisors", "--json")
	var sups []etlcontext.Supervisor
	if err := json.Unmarshal([]byte(res.Stdout), &sups); err != nil || res.Code != 0 {
		w.T.Fatalf("dama supervisors --json: exit %d, %v: %s%s", res.Code, err, res.Stdout, res.Stderr)
	}
	return sups
}

// dama supervisors, the view and a waiting task's reason say who serves:
// a supervisor killed with SIGKILL is LOST at once (its liveness lock is
// gone), a task submitted meanwhile says that no supervisor serves its
// kind and when one was last seen, and one stopped by SIGTERM is STOPPED.
func TestWhoServesIsShown(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	first := w.Start(w.cfg, "supervisor")
	first.WaitReady(t, time.Minute)
	running := w.submitHeld(1, 10)
	w.waitRunning(running)

	sups := w.supervisors()
	if len(sups) != 1 || sups[0].State != etlcontext.SupervisorServing || sups[0].Host != host || *sups[0].PID != first.Cmd.Process.Pid ||
		fmt.Sprint(sups[0].Kinds) != "[sample]" || fmt.Sprint(sups[0].Queues) != "[etl]" || fmt.Sprint(sups[0].LockModes) != "[row]" ||
		sups[0].Running == nil || *sups[0].Running != 1 {
		t.Fatalf("dama supervisors with one serving, running one task: %+v", sups)
	}
	table := w.Dama(w.cfg, "supervisors").Stdout
	if row := lineWith(table, "SERVING"); !regexp.MustCompile(`^SERVING +` + regexp.QuoteMeta(host) + ` +` + strconv.Itoa(first.Cmd.Process.Pid) + ` +\S+ +row +etl +sample +1 +\d\d:\d\d:\d\d \S+ +\d+s ago$`).MatchString(row) {
		t.Errorf("dama supervisors:\n%s", table)
	}

	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The server ends the session, and so the lock, as the socket closes.
	testenv.Eventually(t, 10*time.Second, "the killed supervisor to be LOST", func() (bool, error) {
		sups = w.supervisors()
		return len(sups) == 1 && sups[0].State == etlcontext.SupervisorLost && sups[0].Running == nil, fmt.Errorf("%+v", sups)
	})
	var state string
	if err := w.Pool.QueryRow(context.Background(), `SELECT state FROM data_manager.dama_supervisors`).Scan(&state); err != nil || state != etlcontext.SupervisorLost {
		t.Errorf("data_manager.dama_supervisors says %q (%v), want LOST", state, err)
	}
	waiting := w.submit(1, 10)
	reason := regexp.MustCompile(`QUEUED .* waiting: no supervisor serves kind sample \(last seen \d+s ago on ` + regexp.QuoteMeta(host) + `\)$`)
	if row := lineWith(w.DamaWith(w.cfg, []string{"COLUMNS=200"}, "status").Stdout, strconv.FormatInt(waiting, 10)+" "); !reason.MatchString(row) {
		t.Errorf("the waiting task's row %q: want that no supervisor serves its kind", row)
	}

	second := w.Start(w.cfg, "supervisor")
	second.WaitReady(t, time.Minute)
	w.release()
	w.waitSettled(running, time.Minute)
	w.waitSettled(waiting, time.Minute)
	second.Kill(t, syscall.SIGTERM)
	if err := second.Wait(); err != nil {
		t.Fatalf("the second supervisor, stopped: %v", err)
	}
	// The second replaced the first, lost on its host.
	sups = w.supervisors()
	if len(sups) != 1 || sups[0].State != etlcontext.SupervisorStopped || *sups[0].PID != second.Cmd.Process.Pid || sups[0].StoppedAt == nil {
		t.Errorf("dama supervisors once the second stopped: %+v, want it alone, STOPPED", sups)
	}
}
