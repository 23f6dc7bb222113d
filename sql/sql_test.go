package sql_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/dama-etl/dama/internal/testenv"
	damasql "github.com/dama-etl/dama/sql"
)

func TestMigrateConcurrentlyAndIdempotently(t *testing.T) {
	env := testenv.NewUnmigrated(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = damasql.Migrate(ctx, env.Pool, logger) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent migration %d: %v", i, err)
		}
	}
	if err := damasql.Migrate(ctx, env.Pool, logger); err != nil {
		t.Fatalf("migrating an up-to-date database: %v", err)
	}

	var applied int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.schema_migrations WHERE version_id > 0`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied != 5 {
		t.Errorf("schema_migrations has %d applied versions, want 5 (each migration applied once)", applied)
	}
	var view bool
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) = 0 FROM data_manager.dama_task_queue`).Scan(&view); err != nil {
		t.Fatalf("query the view: %v", err)
	}
	var riverJobs bool
	if err := env.Pool.QueryRow(ctx, `SELECT to_regclass('river_job') IS NOT NULL`).Scan(&riverJobs); err != nil || !riverJobs {
		t.Fatalf("river_job missing after migrate (err %v)", err)
	}
}
