package sql_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/version"
)

func TestMigrateConcurrentlyAndIdempotently(t *testing.T) {
	env := testenv.NewUnmigrated(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = sql.Migrate(ctx, env.Pool, logger) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent migration %d: %v", i, err)
		}
	}
	if err := sql.Migrate(ctx, env.Pool, logger); err != nil {
		t.Fatalf("migrating an up-to-date database: %v", err)
	}

	var applied int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.schema_migrations WHERE version_id > 0`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	latest, err := sql.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if int64(applied) != latest || latest != 39 {
		t.Errorf("schema_migrations has %d applied versions, want %d = 39 (each migration applied once)", applied, latest)
	}
	var migratedBy string
	if err := env.Pool.QueryRow(ctx, `SELECT migrated_by FROM data_manager.compatibility`).Scan(&migratedBy); err != nil || migratedBy != version.Release {
		t.Errorf("compatibility.migrated_by = %q (err %v), want %q", migratedBy, err, version.Release)
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

// A binary older than the schema refuses to run on it, or to migrate it,
// and says which release to run instead.
func TestNewerSchemaIsRefused(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// What a later release's migrate leaves behind.
	if _, err := env.Pool.Exec(ctx, `
		INSERT INTO data_manager.schema_migrations (version_id, is_applied) VALUES (999, true);
		UPDATE data_manager.compatibility SET migrated_by = 'v9.9.9'`); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		var s string
		if err := env.Pool.QueryRow(ctx, `
			SELECT (SELECT string_agg(version_id::text, ',' ORDER BY id) FROM data_manager.schema_migrations)
			       || ' ' || (SELECT migrated_by FROM data_manager.compatibility)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := state()
	for name, err := range map[string]error{
		"CheckMigrated": sql.CheckMigrated(ctx, env.Pool),
		"Migrate":       sql.Migrate(ctx, env.Pool, logger),
	} {
		if !errors.Is(err, sql.ErrSchemaNewer) || !strings.Contains(err.Error(), "version 999, migrated by dama v9.9.9") ||
			!strings.Contains(err.Error(), "run dama v9.9.9 or later") {
			t.Errorf("%s: %v; want ErrSchemaNewer naming version 999 and dama v9.9.9", name, err)
		}
	}
	if after := state(); after != before {
		t.Errorf("the refused Migrate changed the schema: %s -> %s", before, after)
	}
}

// A migration that cannot have its table lock soon fails, having applied
// nothing, rather than queue ahead of every task's writes; run again once
// the lock is gone, it applies.
func TestMigrationWaitsForATableLockOnlySoLong(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Back to the schema before migration 6, which adds columns to
	// etl_contexts.
	db := stdlib.OpenDBFromPool(env.Pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("migrations"),
		goose.WithTableName(sql.Name+".schema_migrations"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	// What a row-mode task process of an unreleased build holds for its
	// life: a transaction that read etl_contexts.
	holder, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM data_manager.etl_contexts`); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	err = sql.Migrate(ctx, env.Pool, logger)
	if err == nil || !strings.Contains(err.Error(), "00006_releases.sql") || !strings.Contains(err.Error(), "stayed locked through 5 tries of 2s") || !strings.Contains(err.Error(), "nothing of it was applied") {
		t.Fatalf("Migrate with etl_contexts locked: %v; want migration 6 refused after the lock timeout", err)
	}
	t.Logf("refused after %s: %v", time.Since(start).Round(time.Millisecond), err)
	var applied bool
	if err := env.Pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM data_manager.schema_migrations WHERE version_id = 6)
		    OR to_regclass('data_manager.compatibility') IS NOT NULL`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied {
		t.Error("the refused migration 6 left part of itself behind")
	}

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sql.Migrate(ctx, env.Pool, logger); err != nil {
		t.Fatalf("Migrate once the lock is gone: %v", err)
	}
	if err := sql.CheckMigrated(ctx, env.Pool); err != nil {
		t.Fatal(err)
	}
}

// CheckRoles names each right a role of dama's lacks, or holds and must
// not, and migrating again puts them right.
func TestCheckRolesSaysWhatIsAmiss(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	if err := sql.CheckRoles(ctx, env.Pool); err != nil {
		t.Fatalf("after migrating: %v", err)
	}
	for _, stmt := range []string{
		`REVOKE INSERT ON data_manager.event_store FROM dama_task`,
		`REVOKE UPDATE (pid) ON data_manager.etl_contexts FROM dama_task`,
		`GRANT UPDATE (meta) ON data_manager.event_store TO dama_task`,
		`GRANT INSERT ON data_manager.etl_contexts TO dama_task`,
		`GRANT EXECUTE ON FUNCTION data_manager.lock_initial_event(bigint) TO PUBLIC`,
		`REVOKE SELECT ON data_manager.dama_task_queue FROM dama_reader`,
		`REVOKE DELETE ON river_job FROM dama_supervisor`,
		`REVOKE UPDATE (state) ON river_job FROM dama_operator`,
	} {
		if _, err := env.Pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	err := sql.CheckRoles(ctx, env.Pool)
	for _, want := range []string{
		"dama_task lacks INSERT (type) on data_manager.event_store",
		"dama_task lacks UPDATE (pid) on data_manager.etl_contexts",
		"dama_task holds UPDATE (meta) on data_manager.event_store",
		"dama_task holds INSERT on data_manager.etl_contexts",
		"dama_reader holds EXECUTE on data_manager.lock_initial_event(bigint)",
		"dama_reader lacks SELECT on data_manager.dama_task_queue",
		"dama_supervisor lacks DELETE on river_job",
		"dama_operator lacks UPDATE (state) on river_job",
	} {
		if !errors.Is(err, sql.ErrRolesIncomplete) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckRoles: %v; want it to say %q", err, want)
		}
	}
	if err := sql.Migrate(ctx, env.Pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if err := sql.CheckRoles(ctx, env.Pool); err != nil {
		t.Errorf("after migrating again: %v", err)
	}
}
