package sql_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
)

// Migrate applies River's migrations and dama's, and may run again (or
// concurrently) at any time; CheckMigrated tells a command whether it can
// rely on the schema.
func ExampleMigrate() {
	env, done := testenv.ForExample()
	defer done()
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	if err := sql.Migrate(ctx, env.Pool, logger); err != nil { // already migrated: nothing to do
		panic(err)
	}
	fmt.Println(sql.CheckMigrated(ctx, env.Pool))

	var columns int
	if err := env.Pool.QueryRow(ctx, `
		SELECT count(*) FROM information_schema.columns
		 WHERE table_schema = 'data_manager' AND table_name = 'dama_task_queue'`).Scan(&columns); err != nil {
		panic(err)
	}
	fmt.Println("dama_task_queue columns:", columns)
	// Output:
	// <nil>
	// dama_task_queue columns: 37
}
