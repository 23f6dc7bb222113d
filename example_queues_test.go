package dama_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
)

// SubmitTx enqueues a task in the caller's own transaction: the task exists
// exactly when the caller's rows commit, and not at all when they roll back.
func ExampleClient_SubmitTx() {
	env, done := testenv.ForExample()
	defer done()
	ctx := context.Background()
	cfg, err := config.Parse([]byte(`
log_dir: /tmp/dama-example-logs
kinds:
  import:
    command: ["/opt/etl/import"]
`))
	if err != nil {
		panic(err)
	}
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	if _, err := env.Pool.Exec(ctx, `CREATE TABLE uploads (name text PRIMARY KEY, etl_context_id bigint)`); err != nil {
		panic(err)
	}
	for _, commit := range []bool{false, true} {
		tx, err := env.Pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		name := fmt.Sprintf("upload-%t.csv", commit)
		id, _, err := client.SubmitTx(ctx, tx, dama.SubmitParams{Kind: "import", Args: json.RawMessage(fmt.Sprintf(`{"file": %q}`, name))})
		if err != nil {
			panic(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO uploads VALUES ($1, $2)`, name, id); err != nil {
			panic(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			panic(err)
		}
	}
	var (
		n            int
		name, status string
	)
	if err := env.Pool.QueryRow(ctx, `
		SELECT count(*) OVER (), u.name, t.etl_status
		  FROM data_manager.dama_task_queue AS t JOIN uploads AS u USING (etl_context_id)`).Scan(&n, &name, &status); err != nil {
		panic(err)
	}
	fmt.Println(n, "task, for", name, status)
	// Output:
	// 1 task, for upload-true.csv QUEUED
}

// A paused queue starts nothing and a blocked kind nothing of its kind, on
// every supervisor, until resumed or unblocked; submissions wait meanwhile,
// and dama_queue_stats shows the pause and the block with their reasons.
func ExampleClient_PauseQueue() {
	env, done := testenv.ForExample()
	defer done()
	ctx := context.Background()
	cfg, err := config.Parse([]byte(`
log_dir: /tmp/dama-example-logs
queues:
  nightly: { max_running: 4 }
kinds:
  export:
    queue: nightly
    max_running: 1                # never two exports at once
    command: ["/opt/etl/export"]
  regional:
    queue: nightly
    concurrency_key: region       # one task per region at a time
    command: ["/opt/etl/regional"]
`))
	if err != nil {
		panic(err)
	}
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	if _, err := client.PauseQueue(ctx, "nightly", "warehouse upgrade"); err != nil {
		panic(err)
	}
	if _, err := client.BlockKind(ctx, "export", "the bucket is full"); err != nil {
		panic(err)
	}
	if _, _, err := client.Submit(ctx, dama.SubmitParams{Kind: "regional", Args: json.RawMessage(`{"region": "eu"}`)}); err != nil {
		panic(err)
	}
	_, _, err = client.Submit(ctx, dama.SubmitParams{Kind: "regional", Args: json.RawMessage(`{}`)})
	fmt.Println(err)

	stats, err := client.QueueStats(ctx)
	if err != nil {
		panic(err)
	}
	for _, s := range stats {
		fmt.Printf("%v %v queued=%d paused=%t blocked=%t %v\n", ptr(s.Queue), ptr(s.Kind), s.Queued, s.Paused, s.Blocked, ptr(s.BlockReason))
	}
	resumed, err := client.ResumeQueue(ctx, "nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("resumed:", resumed)
	// Output:
	// submit regional task: the arguments have no field region, the kind's concurrency_key
	// nightly regional queued=1 paused=true blocked=false <nil>
	// <nil> export queued=0 paused=false blocked=true the bucket is full
	// resumed: true
}

func ptr(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
