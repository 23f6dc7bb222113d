// Package sql holds dama's schema, embedded in the binary, and applies it
// together with River's own migrations.
package sql

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Schema is the PostgreSQL schema that holds dama's tables and view.
const Schema = "data_manager"

// The advisory lock that serializes concurrent migrations: dama's lock
// namespace ('dama', as etlcontext.LockNamespace), and 0, which no context id
// takes.
const (
	lockNamespace  = 1684106593
	migrateLockKey = 0
)

// How often a Migrate waiting for another one tries the lock again.
const migrateLockRetry = 100 * time.Millisecond

// ErrNotMigrated is returned by CheckMigrated for a database that lacks
// dama's latest migration.
var ErrNotMigrated = errors.New("the database is not migrated: run dama migrate")

// CheckMigrated reports ErrNotMigrated unless every migration this binary
// embeds has been applied, so that commands fail with one clear line instead
// of "relation does not exist".
func CheckMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	entries, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil || len(entries) == 0 {
		return fmt.Errorf("list embedded migrations: %w", err)
	}
	var latest int64
	if _, err := fmt.Sscanf(path.Base(entries[len(entries)-1]), "%d_", &latest); err != nil {
		return fmt.Errorf("read embedded migration version: %w", err)
	}
	var applied bool
	err = pool.QueryRow(ctx, `
		SELECT to_regclass('data_manager.schema_migrations') IS NOT NULL
		   AND to_regclass('river_job') IS NOT NULL`).Scan(&applied)
	if err != nil {
		return fmt.Errorf("check migrations: %w", err)
	}
	if applied {
		err = pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM data_manager.schema_migrations WHERE version_id = $1 AND is_applied)`,
			latest).Scan(&applied)
		if err != nil {
			return fmt.Errorf("check migrations: %w", err)
		}
	}
	if !applied {
		return ErrNotMigrated
	}
	return nil
}

// takeMigrateLock waits for the migration lock by trying it again and again
// rather than in pg_advisory_lock: a statement waiting in the server holds a
// snapshot, and CREATE INDEX CONCURRENTLY (migration 5) waits for every older
// snapshot in the database to go, so a second Migrate waiting there would
// wait for the first, and the first for it, forever.
func takeMigrateLock(ctx context.Context, conn *pgxpool.Conn) error {
	for {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", lockNamespace, migrateLockKey).Scan(&ok); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("take migration lock: %w", ctx.Err())
		case <-time.After(migrateLockRetry):
		}
	}
}

// Migrate applies River's migrations and then dama's own, idempotently. It
// holds a session-level advisory lock for the whole run, so that several
// Migrate calls at once (two deploys racing) apply each migration once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection for migration lock: %w", err)
	}
	defer conn.Release()
	if err := takeMigrateLock(ctx, conn); err != nil {
		return err
	}
	defer func() {
		// A fresh context: the lock must be released even when ctx is done.
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", lockNamespace, migrateLockKey); err != nil {
			logger.Warn("release migration lock", "error", err)
		}
	}()

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("create River migrator: %w", err)
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("apply River migrations: %w", err)
	}
	for _, v := range res.Versions {
		logger.Info("applied River migration", "version", v.Version, "name", v.Name)
	}

	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+Schema); err != nil {
		return fmt.Errorf("create schema %s: %w", Schema, err)
	}
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(Schema+".schema_migrations"),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("load dama migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		var partial *goose.PartialError
		if errors.As(err, &partial) && partial.Failed != nil && partial.Failed.Source != nil {
			return fmt.Errorf("apply dama migration %s: %w", partial.Failed.Source.Path, partial.Err)
		}
		return fmt.Errorf("apply dama migrations: %w", err)
	}
	for _, r := range results {
		logger.Info("applied dama migration", "version", r.Source.Version, "file", r.Source.Path)
	}
	return nil
}
