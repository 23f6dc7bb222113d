package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
)

// Submitting records a QUEUED context with its INITIAL event and enqueues
// its River job in one transaction. An idempotency key makes a repeated
// submission return the first one's id.
func ExampleClient_Submit() {
	env, done := testenv.ForExample()
	defer done()
	ctx := context.Background()

	cfg, err := config.Parse([]byte(`
log_dir: /tmp/dama-example-logs
kinds:
  conflation:
    command: ["/opt/etl/conflation"]
`))
	if err != nil {
		panic(err)
	}
	client, err := supervisor.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	params := supervisor.SubmitParams{
		Kind:           "conflation",
		Args:           json.RawMessage(`{"year": 2026}`),
		IdempotencyKey: "conflation-2026",
	}
	id, created, err := client.Submit(ctx, params)
	if err != nil {
		panic(err)
	}
	again, createdAgain, err := client.Submit(ctx, params)
	if err != nil {
		panic(err)
	}
	fmt.Println("same id:", id == again, "created:", created, createdAgain)

	// Any program reads a task from the view, with plain SQL.
	var kind, status, job string
	if err := env.Pool.QueryRow(ctx, `
		SELECT kind, etl_status, job_state FROM data_manager.dama_task_queue
		 WHERE etl_context_id = $1`, id).Scan(&kind, &status, &job); err != nil {
		panic(err)
	}
	fmt.Println(kind, status, job)

	_, _, err = client.Submit(ctx, supervisor.SubmitParams{Kind: "rm-rf"})
	fmt.Println(err)
	// Output:
	// same id: true created: true false
	// conflation QUEUED available
	// unknown kind "rm-rf": the configuration has [conflation]
}

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

	client, err := supervisor.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	id, _, err := client.Submit(ctx, supervisor.SubmitParams{Kind: "report"})
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

// Wait follows a task to its end on the database's announcement (LISTEN
// dama_task_finished), from any host and without polling; here a task
// cancelled before any supervisor ran it.
func ExampleClient_Wait() {
	env, done := testenv.ForExample()
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cfg, err := config.Parse([]byte(`
log_dir: /tmp/dama-example-logs
kinds:
  conflation:
    command: ["/opt/etl/conflation"]
`))
	if err != nil {
		panic(err)
	}
	client, err := supervisor.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	id, _, err := client.Submit(ctx, supervisor.SubmitParams{Kind: "conflation"})
	if err != nil {
		panic(err)
	}
	ended := make(chan *supervisor.Context)
	go func() {
		c, err := client.Wait(ctx, id)
		if err != nil {
			panic(err)
		}
		ended <- c
	}()
	if _, err := client.Cancel(ctx, id); err != nil {
		panic(err)
	}
	c := <-ended
	fmt.Println(c.ID == id, c.Status)

	_, err = client.Wait(ctx, id+1000)
	fmt.Println(errors.Is(err, supervisor.ErrNotFound))
	// Output:
	// true CANCELLED
	// true
}
