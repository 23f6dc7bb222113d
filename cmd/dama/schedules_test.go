package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
)

// scheduledTask is a context a periodic kind's tick submitted.
type scheduledTask struct {
	id       int64
	tick     time.Time
	status   string
	created  time.Time
	started  *time.Time
	finished *time.Time
	// firstEvent and finalEvent are the ids of the task's first event
	// (written as it was submitted) and of its FINAL: ids are taken in
	// the order the events were written, which created_at and
	// finished_at, each its transaction's start, are not.
	firstEvent, finalEvent *int64
}

// scheduled returns the contexts kind's ticks submitted, by tick, read
// from their idempotency keys.
func (w *world) scheduled(kind string) []scheduledTask {
	w.T.Helper()
	rows, err := w.Pool.Query(context.Background(), `
		SELECT c.etl_context_id, c.idempotency_key, c.etl_status, c.created_at, c.started_at, c.finished_at,
		       (SELECT min(e.event_id) FROM data_manager.event_store e WHERE e.etl_context_id = c.etl_context_id),
		       (SELECT max(e.event_id) FROM data_manager.event_store e WHERE e.etl_context_id = c.etl_context_id AND e.type LIKE '%:FINAL')
		  FROM data_manager.etl_contexts AS c WHERE c.kind = $1 ORDER BY c.idempotency_key`, kind)
	if err != nil {
		w.T.Fatal(err)
	}
	defer rows.Close()
	var list []scheduledTask
	for rows.Next() {
		var (
			s   scheduledTask
			key *string
		)
		if err := rows.Scan(&s.id, &key, &s.status, &s.created, &s.started, &s.finished, &s.firstEvent, &s.finalEvent); err != nil {
			w.T.Fatal(err)
		}
		prefix := "dama:schedule:" + kind + ":"
		if key == nil || !strings.HasPrefix(*key, prefix) {
			w.T.Fatalf("context %d of %s has idempotency key %v, want %s…", s.id, kind, deref(key), prefix)
		}
		if s.tick, err = time.Parse(time.RFC3339, strings.TrimPrefix(*key, prefix)); err != nil {
			w.T.Fatal(err)
		}
		list = append(list, s)
	}
	if err := rows.Err(); err != nil {
		w.T.Fatal(err)
	}
	return list
}

// waitScheduled waits until kind's ticks have submitted at least n tasks.
func (w *world) waitScheduled(kind string, n int, timeout time.Duration) []scheduledTask {
	w.T.Helper()
	var list []scheduledTask
	testenv.Eventually(w.T, timeout, fmt.Sprintf("%d tasks of %s", n, kind), func() (bool, error) {
		list = w.scheduled(kind)
		return len(list) >= n, fmt.Errorf("%d so far", len(list))
	})
	return list
}

// dbNow is the database's clock, by which ticks are taken.
func (w *world) dbNow() time.Time {
	w.T.Helper()
	var now time.Time
	if err := w.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		w.T.Fatal(err)
	}
	return now
}

// Three supervisors configure the same kind, ticking every 3 s; one of
// them is killed with SIGKILL and started again meanwhile. Every tick from
// the first to the last gives exactly one task, started once. (A tick that
// no supervisor takes before the next is folded into it, as a missed one
// is: every second, a busy machine's supervisors can be that late.)
func TestScheduleOneTaskPerTickAcrossSupervisors(t *testing.T) {
	t.Parallel()
	w, _ := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 10 }
kinds:
  tick:
    queue: etl
    command: ["{{sample}}"]
    schedule: "*/3 * * * * *"
    overlap: allow
    schedule_args: { steps: 1, step_ms: 10, starts_dir: "{{dir}}/starts" }
`)
	sups := []*testenv.Proc{w.Start(w.cfg, "supervisor"), w.Start(w.cfg, "supervisor"), w.Start(w.cfg, "supervisor")}
	w.waitScheduled("tick", 3, time.Minute)
	sups[0].Kill(t, syscall.SIGKILL)
	<-sups[0].Done()
	w.waitScheduled("tick", 5, time.Minute)
	sups[0] = w.Start(w.cfg, "supervisor")
	sups[0].WaitReady(t, 30*time.Second)
	w.waitScheduled("tick", 8, time.Minute)
	// The supervisors run on, to finish these tasks and submit later ones.
	list := w.scheduled("tick")
	folded := 0
	for i, s := range list {
		if i > 0 {
			// A tick no supervisor took before the next one is folded into
			// it: a gap of several periods, never a tick off the schedule
			// or twice.
			gap := s.tick.Sub(list[i-1].tick)
			if gap <= 0 || gap%(3*time.Second) != 0 {
				t.Errorf("ticks %s and %s are %v apart: want one task per tick, on ticks 3 s apart", list[i-1].tick, s.tick, gap)
			}
			folded += int(gap/(3*time.Second)) - 1
		}
		w.waitSettled(s.id, 30*time.Second)
	}
	if folded > 0 {
		t.Logf("%d ticks folded into the next: no supervisor took them within 3 s; %s", folded, testenv.Pace())
	}
	// A schedule that fired every other tick is no busy machine's doing.
	if folded > len(list)/2 {
		t.Errorf("%d ticks folded among %d tasks: want most ticks to give a task of their own", folded, len(list))
	}
	ids := make([]int64, len(list))
	for i, s := range list {
		ids[i] = s.id
	}
	w.startedOnce(ids)
	t.Logf("%d ticks from %s to %s, one task each", len(list), list[0].tick.Format(time.TimeOnly), list[len(list)-1].tick.Format(time.TimeOnly))
}

// Ticks missed while no supervisor ran give one task, for the last of
// them, at the next start; a new schedule starts with its next tick.
func TestMissedTicksGiveOneTask(t *testing.T) {
	t.Parallel()
	w, _ := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  tick:
    command: ["{{sample}}"]
    schedule: "* * * * * *"
    schedule_args: { steps: 1, step_ms: 10, starts_dir: "{{dir}}/starts" }
`)
	sup := w.Start(w.cfg, "supervisor")
	// Taking the schedule up says which tick is its first: read from the
	// log, as the row has moved on by the next second, which a slow test
	// may not see before.
	var first time.Time
	testenv.Eventually(t, 30*time.Second, "the schedule to be taken up", func() (bool, error) {
		b, err := os.ReadFile(sup.Log)
		_, after, ok := strings.Cut(string(b), `msg="schedule taken up" kind=tick`)
		if !ok {
			return false, err
		}
		_, after, _ = strings.Cut(after, "next_tick=")
		after, _, _ = strings.Cut(after, "\n")
		first, err = time.Parse(time.RFC3339Nano, after)
		return err == nil, err
	})
	before := w.waitScheduled("tick", 2, 30*time.Second)
	if before[0].tick.Before(first) {
		t.Errorf("first task for tick %s, before the first tick after the schedule was taken up (%s)", before[0].tick, first)
	}
	sup.Kill(t, syscall.SIGKILL)
	<-sup.Done()
	last := w.scheduled("tick")
	killed := w.dbNow()
	// The outage itself: ticks pass with no supervisor.
	testenv.Eventually(t, time.Minute, "4s of the database's clock with no supervisor", func() (bool, error) {
		return w.dbNow().Sub(killed) >= 4*time.Second, nil
	})
	restarted := w.dbNow()
	w.Start(w.cfg, "supervisor").WaitReady(t, time.Minute)
	// The catch-up task and two regular ticks' after it.
	after := w.waitScheduled("tick", len(last)+3, time.Minute)
	caughtUp := after[len(last)]
	if next := after[len(last)+1]; !next.tick.After(restarted) {
		t.Errorf("ticks %s and %s, both missed while no supervisor ran, gave a task each: want one", caughtUp.tick, next.tick)
	}
	if !caughtUp.tick.After(restarted.Add(-time.Second)) || caughtUp.tick.Sub(last[len(last)-1].tick) < 4*time.Second {
		t.Errorf("missed ticks gave a task for %s; the last before the outage was %s, and the supervisor came back at %s: want the last missed tick",
			caughtUp.tick, last[len(last)-1].tick, restarted)
	}
	w.waitSettled(caughtUp.id, 30*time.Second)
	res := w.Dama(w.cfg, "schedules")
	if res.Code != 0 || lineWith(res.Stdout, "tick", "* * * * * *", "UTC", "skip") == "" {
		t.Errorf("dama schedules: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	t.Logf("last tick before the outage %s, supervisor back at %s, catch-up task for %s",
		last[len(last)-1].tick.Format(time.TimeOnly), restarted.Format("15:04:05.000"), caughtUp.tick.Format(time.TimeOnly))
}

// overlap: skip lets ticks pass while a task of the kind is unfinished;
// queue submits them to run one after another; allow lets them run at once.
func TestOverlap(t *testing.T) {
	t.Parallel()
	w, _ := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 20 }
kinds:
  skipper:
    queue: etl
    command: ["{{sample}}"]
    schedule: "* * * * * *"
    overlap: skip
    schedule_args: { steps: 5, step_ms: 500, starts_dir: "{{dir}}/starts" }
  queuer:
    queue: etl
    command: ["{{sample}}"]
    schedule: "* * * * * *"
    overlap: queue
    schedule_args: { steps: 4, step_ms: 500, starts_dir: "{{dir}}/starts" }
  allower:
    queue: etl
    command: ["{{sample}}"]
    schedule: "* * * * * *"
    overlap: allow
    schedule_args: { steps: 5, step_ms: 500, starts_dir: "{{dir}}/starts" }
`)
	running := w.sample(`SELECT kind, count(*) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING' GROUP BY kind`)
	unfinished := w.sample(`SELECT kind, count(*) FROM data_manager.etl_contexts WHERE etl_status IN ('QUEUED', 'RUNNING') GROUP BY kind`)
	outcomes := w.sample(`SELECT kind || ':' || last_outcome, 1 FROM data_manager.schedules`)
	sup := w.Start(w.cfg, "supervisor")
	w.waitScheduled("allower", 8, 60*time.Second)
	sup.Kill(t, syscall.SIGTERM)
	<-sup.Done()
	most, seen, waiting := running.finish(t), outcomes.finish(t), unfinished.finish(t)

	skipped, queued, allowed := w.scheduled("skipper"), w.scheduled("queuer"), w.scheduled("allower")
	t.Logf("in the time allow took %d ticks: skip submitted %d, queue %d; most running at once: %v", len(allowed), len(skipped), len(queued), most)
	if most["skipper"] != 1 || seen["skipper:skipped"] == 0 || len(skipped) > 3 {
		t.Errorf("skip: %d running at once, skipped seen %v, %d tasks: want 1 at a time, ticks skipped", most["skipper"], seen["skipper:skipped"] > 0, len(skipped))
	}
	// A tick's task was submitted once the one before had finished: its
	// first event was written after the other's FINAL. (Their times are
	// each their transaction's start: a tick's transaction may begin
	// before the FINAL's and read it committed.)
	for i := 1; i < len(skipped); i++ {
		prev, next := skipped[i-1], skipped[i]
		if prev.finalEvent == nil || next.firstEvent == nil || *next.firstEvent < *prev.finalEvent {
			t.Errorf("skip: tick %s submitted (first event %v, at %s) before the task of tick %s finished (FINAL event %v, at %v)",
				next.tick, deref(next.firstEvent), next.created, prev.tick, deref(prev.finalEvent), deref(prev.finished))
		}
	}
	// Queue submits at each tick it takes, however many wait: its tasks
	// (2 s each, a tick a second) pile up. (How many ticks it takes is
	// the machine's: on a stalled host a tick none took before the next is
	// folded into it, as for allow.)
	if most["queuer"] != 1 || seen["queuer:skipped"] != 0 || waiting["queuer"] < 2 {
		t.Errorf("queue: %d running at once, skipped seen %v, at most %d unfinished at once (%d tasks for %d ticks of allow): want 1 at a time, none skipped, tasks waiting behind it",
			most["queuer"], seen["queuer:skipped"] > 0, waiting["queuer"], len(queued), len(allowed))
	}
	if most["allower"] < 2 {
		t.Errorf("allow: at most %d running at once, want overlapping runs", most["allower"])
	}
}
