package etlcontext_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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

// Whether a supervisor serves is its liveness lock, held by a session of
// its own: the moment that session ends, the supervisor is LOST, whatever
// its last sighting says; one that stops says so.
func ExampleSupervisors() {
	env, done := testenv.ForExample()
	defer done()
	ctx := context.Background()
	state := func() string {
		sups, err := etlcontext.Supervisors(ctx, env.Pool)
		if err != nil {
			panic(err)
		}
		return sups[0].State
	}

	const client = "etl-1_2026_12_07T09_12_40_000000"
	live, err := pgx.Connect(ctx, env.URL)
	if err != nil {
		panic(err)
	}
	if _, err := live.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, etlcontext.ClientLockNamespace, client); err != nil {
		panic(err)
	}
	err = etlcontext.SupervisorServes(ctx, env.Pool, etlcontext.Supervisor{
		ClientID: client, Host: "etl-1", HostID: new("boot/ns"), PID: new(4242), Release: new("v0.2.0"),
		LockModes: []string{"row"}, Queues: []string{"etl"}, Kinds: []string{"load"}, PodKinds: []string{},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(state())

	// Its session ends, as a SIGKILL's would; the call returns once it has.
	var ended bool
	if err := env.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, live.PgConn().PID()).Scan(&ended); err != nil || !ended {
		panic(fmt.Sprint("end the supervisor's session: ", ended, err))
	}
	live.Close(ctx)
	fmt.Println(state())

	if err := etlcontext.SupervisorStops(ctx, env.Pool, client); err != nil {
		panic(err)
	}
	fmt.Println(state())
	// Output:
	// SERVING
	// LOST
	// STOPPED
}
