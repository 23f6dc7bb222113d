package supervisor_test

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// TestAFloodOfNotificationsCostsBoundedWork: anyone who can connect may
// NOTIFY dama's channels. 50,000 announced exits and 10,000 queue controls
// cost the supervisor a bounded number of goroutines, and a task submitted
// behind them still runs.
func TestAFloodOfNotificationsCostsBoundedWork(t *testing.T) {
	env := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	sup, err := supervisor.New(env.Pool, cfg, supervisor.Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- sup.Run(runCtx) }()
	defer func() {
		stop()
		<-stopped
	}()
	select {
	case <-sup.Started():
	case err := <-stopped:
		t.Fatalf("supervisor: %v", err)
	}
	base := runtime.NumGoroutine()

	flooded := make(chan error, 1)
	go func() {
		_, err := env.Pool.Exec(ctx, `
			SELECT pg_notify('dama_task_exited', g::text) FROM generate_series(1, 50000) AS g;
			SELECT pg_notify('dama_queue_control', json_build_object('queue', 'default', 'n', g)::text) FROM generate_series(1, 10000) AS g`)
		flooded <- err
	}()
	peak := base
	var floodErr error
	testenv.Eventually(t, time.Minute, "the flood to be sent", func() (bool, error) {
		peak = max(peak, runtime.NumGoroutine())
		select {
		case floodErr = <-flooded:
			return true, nil
		default:
			return false, nil
		}
	})
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	client, err := supervisor.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := client.Submit(ctx, supervisor.SubmitParams{Kind: "quick"})
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
	if peak > base+50 {
		t.Errorf("goroutines rose from %d to %d during the flood, want a bounded few", base, peak)
	}
}
