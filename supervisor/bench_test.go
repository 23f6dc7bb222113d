package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// BenchmarkLatency measures, over b.N tasks submitted one after another with
// the shipped defaults:
//
//   - start: from Submit returning to the task process holding its lock
//     (process_started_at is not precise enough; the runner's recorded
//     heartbeat_at is set in the same statement that records its pid);
//   - settle: from the task's FINAL event to its River job's finalized_at.
//
// The task sleeps 0.5s: a task that ends within River's completer flush
// (250ms) of its launch waits for that flush, and no ETL task is that short.
//
// Run with: scripts/test.sh -run '^$' -bench Latency -benchtime 300x ./supervisor
func BenchmarkLatency(b *testing.B) {
	env := testenv.New(b)
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
queues:
  bench: { max_running: 50 }
kinds:
  noop:
    queue: bench
    command: ["/bin/sleep", "0.5"]
`))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The pool `dama supervisor` runs with (20 connections), not pgxpool's
	// default (4 on two cores).
	pcfg, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	sup, err := supervisor.New(pool, cfg, supervisor.Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-sup.Started():
	case err := <-done:
		b.Fatalf("supervisor: %v", err)
	}

	starts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "noop"})
		if err != nil {
			b.Fatal(err)
		}
		submitted := time.Now()
		// Every millisecond: the resolution of the measure.
		testenv.EventuallyEvery(b, time.Millisecond, 30*time.Second, fmt.Sprintf("task %d to start", id), func() (bool, error) {
			var locked bool
			if err := env.Pool.QueryRow(ctx, `SELECT pid IS NOT NULL FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&locked); err != nil {
				b.Fatal(err)
			}
			if locked {
				starts = append(starts, time.Since(submitted))
			}
			return locked, nil
		})
	}
	// Wait for every job to settle, then read the exit-to-finalized latency
	// from the database's own clock.
	testenv.Eventually(b, 60*time.Second, "every job to settle", func() (bool, error) {
		var open int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE finalized_at IS NULL`).Scan(&open); err != nil {
			return false, err
		}
		return open == 0, fmt.Errorf("%d jobs not settled", open)
	})
	b.StopTimer()
	rows, err := env.Pool.Query(ctx, `
		SELECT extract(epoch FROM j.finalized_at - e.created_at)
		  FROM data_manager.etl_contexts AS c
		  JOIN river_job AS j ON j.id = c.river_job_id
		  JOIN data_manager.event_store AS e ON e.event_id = c.latest_event_id`)
	if err != nil {
		b.Fatal(err)
	}
	var settles []time.Duration
	for rows.Next() {
		var secs float64
		if err := rows.Scan(&secs); err != nil {
			b.Fatal(err)
		}
		settles = append(settles, time.Duration(secs*float64(time.Second)))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	report(b, "start", starts)
	report(b, "settle", settles)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func report(b *testing.B, name string, ds []time.Duration) {
	slices.Sort(ds)
	pct := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), name+"-p50-ms")
	b.ReportMetric(pct(0.99), name+"-p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1].Microseconds())/1000, name+"-max-ms")
	fmt.Fprintf(os.Stderr, "%s: n=%d p50=%.1fms p99=%.1fms max=%.1fms\n", name, len(ds), pct(0.5), pct(0.99), float64(ds[len(ds)-1].Microseconds())/1000)
}
