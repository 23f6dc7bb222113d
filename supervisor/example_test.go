package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// A supervisor runs each task as a detached process that reports events on
// descriptor 3; the context's status follows from the events.
func ExampleSupervisor_Run() {
	env, done := testenv.ForExample()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  report:
    command: ["/bin/sh", "-c", "echo '{\"type\":\"progress\",\"payload\":{\"pct\":100}}' >&3"]
`))
	if err != nil {
		panic(err)
	}
	sup, err := supervisor.New(env.Pool, cfg, supervisor.Options{
		DatabaseURL: env.URL,
		Executable:  env.DamaBin, // the dama binary, which runs `dama taskrunner`
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- sup.Run(ctx) }()

	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "report"})
	if err != nil {
		panic(err)
	}
	waitCtx, stopWaiting := context.WithTimeout(ctx, 30*time.Second)
	defer stopWaiting()
	if _, err := client.Wait(waitCtx, id); err != nil {
		panic(err)
	}
	var (
		status   string
		progress []byte
	)
	if err := env.Pool.QueryRow(ctx, `
		SELECT etl_status, progress FROM data_manager.dama_task_queue
		 WHERE etl_context_id = $1`, id).Scan(&status, &progress); err != nil {
		panic(err)
	}
	fmt.Println(status, string(progress))
	events, err := env.Pool.Query(ctx, `
		SELECT attempt, type FROM data_manager.event_store
		 WHERE etl_context_id = $1 ORDER BY event_id`, id)
	if err != nil {
		panic(err)
	}
	var (
		attempt int
		typ     string
	)
	if _, err := pgx.ForEachRow(events, []any{&attempt, &typ}, func() error {
		fmt.Println(attempt, typ)
		return nil
	}); err != nil {
		panic(err)
	}

	cancel() // stops River; a task still running would go on
	if err := <-stopped; err != nil {
		panic(err)
	}
	// Output:
	// DONE {"pct": 100}
	// 0 report:INITIAL
	// 1 report:PROGRESS
	// 1 report:FINAL
}
