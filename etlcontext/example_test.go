package etlcontext_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// The database derives a context's status from its events, and refuses
// writes from an attempt that is no longer current.
func ExampleAppend() {
	env, done := testenv.ForExample()
	defer done()
	ctx := context.Background()

	var id int64
	if err := env.Pool.QueryRow(ctx, `
		INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts) VALUES ('load', 'etl', 2)
		RETURNING etl_context_id`).Scan(&id); err != nil {
		panic(err)
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "load:INITIAL", Payload: map[string]string{"table": "roads"}}); err != nil {
		panic(err)
	}
	start := func() string {
		var run string
		if err := env.Pool.QueryRow(ctx, `
			UPDATE data_manager.etl_contexts SET etl_status = 'RUNNING', attempt = attempt + 1, run_id = gen_random_uuid()
			 WHERE etl_context_id = $1 RETURNING run_id::text`, id).Scan(&run); err != nil {
			panic(err)
		}
		return run
	}
	status := func() etlcontext.Status {
		c, err := etlcontext.Get(ctx, env.Pool, id)
		if err != nil {
			panic(err)
		}
		return c.Status
	}

	first := start()
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "load:ERROR", RunID: &first}); err != nil {
		panic(err)
	}
	fmt.Println(status())

	second := start()
	_, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "load:PROGRESS", RunID: &first})
	fmt.Println("stale write refused:", errors.Is(err, etlcontext.ErrStaleRun))

	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "load:FINAL", RunID: &second}); err != nil {
		panic(err)
	}
	fmt.Println(status())

	_, err = etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "load:PROGRESS", RunID: &second})
	fmt.Println("write after DONE refused:", errors.Is(err, etlcontext.ErrFinished))
	// Output:
	// RETRYING
	// stale write refused: true
	// DONE
	// write after DONE refused: true
}
