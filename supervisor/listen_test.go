package supervisor_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/supervisor"
)

// startSupervisor runs a supervisor of cfg on pool, registering its
// metrics with reg, until the test ends or the function it returns stops
// it.
func startSupervisor(ctx context.Context, t *testing.T, env *testenv.Env, pool *pgxpool.Pool, cfg *config.Config, reg *prometheus.Registry) (stop func()) {
	t.Helper()
	sup, err := supervisor.New(pool, cfg, supervisor.Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(slog.DiscardHandler),
		Registerer:  reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- sup.Run(runCtx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-stopped
		})
	}
	t.Cleanup(stop)
	select {
	case <-sup.Started():
	case err := <-stopped:
		t.Fatalf("supervisor: %v", err)
	}
	return stop
}

// heard is what the listener took in of channel, by outcome.
func heard(t *testing.T, reg *prometheus.Registry, channel string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "dama_notifications_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["channel"] == channel {
				out[labels["outcome"]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestAFloodOfNotificationsCostsBoundedWork: anyone who can connect may
// NOTIFY dama's channels. 50,000 announced exits and 10,000 queue controls
// cost the supervisor a bounded number of goroutines while its listener
// takes them in (dama_notifications_total says when it has): the exits of
// tasks it holds no job of are ignored, the controls coalesce, and a task
// submitted behind them runs.
func TestAFloodOfNotificationsCostsBoundedWork(t *testing.T) {
	env := testenv.New(t)
	// No deadline: the waits below bound the test, stretched on a slow
	// machine (testenv.Eventually), and this runs its supervisors.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  quick:
    command: ["/bin/true"]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	startSupervisor(ctx, t, env, env.Pool, cfg, reg)
	heard := func(channel string) map[string]float64 { return heard(t, reg, channel) }
	base := runtime.NumGoroutine()
	if err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, g::text) FROM generate_series(1, 50000) AS g`, protocol.ExitedChannel); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, json_build_object('queue', 'default', 'n', g)::text) FROM generate_series(1, 10000) AS g`, etlcontext.ControlChannel)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	peak := base
	testenv.Eventually(t, time.Minute, "the listener to take the flood in", func() (bool, error) {
		peak = max(peak, runtime.NumGoroutine())
		exits, controls := heard(protocol.ExitedChannel), heard(etlcontext.ControlChannel)
		n := exits["ignored"] + controls["queued"]
		return n >= 60000, nil
	})
	if exits := heard(protocol.ExitedChannel); exits["ignored"] != 50000 {
		t.Errorf("exits heard: %v; want 50,000 ignored", exits)
	}

	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "quick"})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan *etlcontext.Context, 1)
	go func() {
		c, err := client.Wait(ctx, id)
		if err != nil {
			t.Error(err)
		}
		ended <- c
	}()
	for done := false; !done; {
		peak = max(peak, runtime.NumGoroutine())
		select {
		case c := <-ended:
			if c == nil || c.Status != etlcontext.StatusDone {
				t.Fatalf("the task behind the flood: %+v, want DONE", c)
			}
			done = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Logf("goroutines: %d before the flood, at most %d during it", base, peak)
	// River's services, a launch and pgx's watchers come and go: a bound
	// far below one goroutine per notification.
	if peak > base+100 {
		t.Errorf("goroutines rose from %d to %d during the flood, want a bounded few", base, peak)
	}
}

// Anyone who can connect may announce a queue's resume: 300 such
// announcements, each in a transaction of its own, wake the waiting tasks
// at most once per 100 ms.
func TestAFloodOfControlsWakesTheQueuesAtMostEvery100ms(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// No deadline: the waits below bound the test, stretched on a slow
	// machine (testenv.Eventually), and this runs its supervisors.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 1h
kinds:
  quick:
    command: ["/bin/true"]
`))
	if err != nil {
		t.Fatal(err)
	}
	// The wake-ups of waiting tasks (etlcontext.WakeWaitingJobs), not the
	// watch that wakes parked ones too.
	pool, wakes := testenv.CountingPool(t, env, "WITH due AS (")
	reg := prometheus.NewRegistry()
	startSupervisor(ctx, t, env, pool, cfg, reg)
	// The poll interval's first wake-up runs just after the start, outside
	// the bound: counted, it made 6 of 5 in CI.
	testenv.Eventually(t, time.Minute, "the start's wake-up", func() (bool, error) {
		return wakes.Load() >= 1, nil
	})
	base, start := wakes.Load(), time.Now()
	for range 300 {
		if _, err := env.Pool.Exec(ctx, `SELECT pg_notify($1, '{"queue": "default"}')`, etlcontext.ControlChannel); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, "the listener to take the flood in", func() (bool, error) {
		return heard(t, reg, etlcontext.ControlChannel)["queued"] >= 300, nil
	})
	n, elapsed := wakes.Load()-base, time.Since(start)
	t.Logf("%d wake-ups in %s for 300 announced controls", n, elapsed.Round(time.Millisecond))
	if limit := int64(elapsed/(100*time.Millisecond)) + 1; n > limit {
		t.Errorf("%d wake-ups in %s, want at most %d", n, elapsed, limit)
	}
}

// Anyone who can connect may announce a task's exit: 10,000 announcements
// of an adopted task's exit (its own runners' the supervisor ignores: their
// reaping pokes) step its held job at most twice a second, and the task's
// true end still completes it.
func TestAFloodOfExitsStepsAHoldAtMostTwiceASecond(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// No deadline: the waits below bound the test, stretched on a slow
	// machine (testenv.Eventually), and this runs its supervisors.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	goFile := filepath.Join(env.Dir, "go")
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 1h
kinds:
  waiter: { command: ["/bin/sh", "-c", "while [ ! -e ` + goFile + ` ]; do sleep 0.2; done"] }
`))
	if err != nil {
		t.Fatal(err)
	}
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	held := func(id int64) (bool, error) {
		var held bool
		err := env.Pool.QueryRow(ctx, `
			SELECT q.etl_status = 'RUNNING' AND q.pid IS NOT NULL AND q.initial_event_locked AND j.state = 'running'
			  FROM data_manager.dama_task_queue AS q JOIN river_job AS j ON j.id = q.river_job_id
			 WHERE q.etl_context_id = $1`, id).Scan(&held)
		return held, err
	}
	stopFirst := startSupervisor(ctx, t, env, env.Pool, cfg, prometheus.NewRegistry())
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "waiter"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(goFile, nil, 0o644) })
	testenv.Eventually(t, time.Minute, "the task's job to be held", func() (bool, error) { return held(id) })
	stopFirst()

	// The steps' tries of the task's lock (etlcontext.LockStep).
	pool, steps := testenv.CountingPool(t, env, "data_manager.lock_step(")
	reg := prometheus.NewRegistry()
	startSupervisor(ctx, t, env, pool, cfg, reg)
	testenv.Eventually(t, time.Minute, "the second supervisor to hold the task's job", func() (bool, error) {
		ok, err := held(id)
		return ok && steps.Load() > 0, err
	})

	base, start := steps.Load(), time.Now()
	for range 5 {
		// Distinct (the server sends a transaction's equal notifications
		// once), by their leading zeros.
		if _, err := env.Pool.Exec(ctx, `SELECT pg_notify($1, lpad($2, length($2) + g, '0')) FROM generate_series(1, 2000) AS g`,
			protocol.ExitedChannel, strconv.FormatInt(id, 10)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, "the listener to take the flood in", func() (bool, error) {
		return heard(t, reg, protocol.ExitedChannel)["queued"] >= 10000, nil
	})
	n, elapsed := steps.Load()-base, time.Since(start)
	t.Logf("%d steps in %s for 10,000 announced exits", n, elapsed.Round(time.Millisecond))
	if limit := 2*int64(elapsed/time.Second) + 2; n > limit {
		t.Errorf("%d steps in %s, want at most %d", n, elapsed, limit)
	}

	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the task's job to be completed", func() (bool, error) {
		var done bool
		err := env.Pool.QueryRow(ctx, `
			SELECT c.etl_status = 'DONE' AND j.state = 'completed'
			  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
			 WHERE c.etl_context_id = $1`, id).Scan(&done)
		return done, err
	})
}
