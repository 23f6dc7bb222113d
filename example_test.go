package dama_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
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
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	params := dama.SubmitParams{
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

	_, _, err = client.Submit(ctx, dama.SubmitParams{Kind: "rm-rf"})
	fmt.Println(err)
	// Output:
	// same id: true created: true false
	// conflation QUEUED available
	// unknown kind "rm-rf": the configuration has [conflation]
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
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "conflation"})
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
