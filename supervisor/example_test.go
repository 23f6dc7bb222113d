package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
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

	tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: id})
	if err != nil {
		panic(err)
	}
	fmt.Println(tasks[0].Kind, tasks[0].Status, *tasks[0].JobState)

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
	tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: id})
	if err != nil {
		panic(err)
	}
	fmt.Println(tasks[0].Status, string(tasks[0].Progress))
	events, err := etlcontext.Events(ctx, env.Pool, id)
	if err != nil {
		panic(err)
	}
	for _, e := range events {
		fmt.Println(e.Attempt, e.Type)
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
	ended := make(chan *etlcontext.Context)
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
	fmt.Println(errors.Is(err, etlcontext.ErrNotFound))
	// Output:
	// true CANCELLED
	// true
}
