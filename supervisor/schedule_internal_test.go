package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// A supervisor whose look at a schedule waited (here, 1.5 s behind another
// supervisor's, holding the kind's schedule lock) wakes at the next tick,
// not that much after it: the wait is counted from when the database's
// clock was read.
func TestAScheduleLookThatWaitedWakesAtTheNextTick(t *testing.T) {
	env, cfg, _ := newTestClient(t)
	ctx := context.Background()
	s := newTestSupervisor(t, env, env.Pool, cfg)
	k := cfg.Kinds["ticked"]
	sched, err := k.ScheduleOf()
	if err != nil || sched == nil {
		t.Fatalf("schedule of ticked: %v, %v", sched, err)
	}

	other, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, _, _, err := etlcontext.LockSchedule(ctx, other, "ticked"); err != nil {
		t.Fatal(err)
	}
	type look struct {
		wait     time.Duration
		returned time.Time
		err      error
	}
	looked := make(chan look, 1)
	go func() {
		wait, err := s.takeTick(ctx, "ticked", k, sched)
		looked <- look{wait, time.Now(), err}
	}()
	testenv.Eventually(t, time.Minute, "the look to wait for the schedule lock", func() (bool, error) {
		var waiting bool
		err := env.Pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			                WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database())`).Scan(&waiting)
		return waiting, err
	})
	const held = 1500 * time.Millisecond
	if !testenv.Holds(held, func() bool { return len(looked) == 0 }) {
		t.Fatalf("the look ended while another held the schedule lock: %+v", <-looked)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-looked
	if got.err != nil {
		t.Fatal(got.err)
	}
	var next time.Time
	if err := env.Pool.QueryRow(ctx, `SELECT next_tick FROM data_manager.schedules WHERE kind = 'ticked'`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if wake := got.returned.Add(got.wait); wake.After(next.Add(held / 3)) {
		t.Errorf("woken at %s, %s after the next tick %s: the look's %s of waiting was not taken off",
			wake.Format(time.StampMilli), wake.Sub(next).Round(time.Millisecond), next.Format(time.StampMilli), held)
	}
}
