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
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/version"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Name is the PostgreSQL schema that holds dama's tables and view.
const Name = "data_manager"

// The advisory lock that serializes concurrent migrations is
// (protocol.LockNamespace, migrateLockKey): no context id is 0. A Migrate
// waiting for another one tries it again every migrateLockRetry.
const (
	migrateLockKey   = 0
	migrateLockRetry = 100 * time.Millisecond
)

// lockTimeout bounds how long a migration waits for a table lock. A
// migration waiting for ACCESS EXCLUSIVE makes every later statement on the
// table wait behind it, the writes of every running task among them: a
// migration that cannot have its lock soon gives up (rolled back when it
// runs in a transaction) and is tried again (lockTries).
const lockTimeout = 2 * time.Second

// A migration refused for its lock is tried lockTries times in all,
// lockRetryPause apart: short waits, each well within a task's write
// timeout (10 s), rather than one long one.
const (
	lockTries      = 5
	lockRetryPause = time.Second
)

// noTransaction reports whether the migration in file runs outside a
// transaction (goose's NO TRANSACTION annotation).
func noTransaction(file string) bool {
	body, err := fs.ReadFile(migrations, "migrations/"+path.Base(file))
	return err == nil && strings.Contains(string(body), "-- +goose NO TRANSACTION")
}

// ErrNotMigrated is returned by CheckMigrated for a database that lacks
// dama's latest migration.
var ErrNotMigrated = errors.New("the database is not migrated: run dama migrate")

// ErrSchemaNewer is returned by CheckMigrated and Migrate for a database
// migrated by a newer release than this binary: it refuses to run on a
// schema it does not know rather than misjudge the tasks it finds there.
var ErrSchemaNewer = errors.New("the database schema is newer than this dama")

// Latest returns the version of the newest migration this binary embeds.
func Latest() (int64, error) {
	entries, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil || len(entries) == 0 {
		return 0, fmt.Errorf("list embedded migrations: %w", err)
	}
	var latest int64
	if _, err := fmt.Sscanf(path.Base(entries[len(entries)-1]), "%d_", &latest); err != nil {
		return 0, fmt.Errorf("read embedded migration version: %w", err)
	}
	return latest, nil
}

// CheckMigrated reports ErrNotMigrated unless every migration this binary
// embeds has been applied, so that commands fail with one clear line instead
// of "relation does not exist"; and ErrSchemaNewer when the database has
// migrations this binary does not know.
func CheckMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	applied, latest, err := versions(ctx, pool)
	if err == nil && applied < latest {
		return ErrNotMigrated
	}
	return err
}

// versions returns the newest dama migration applied to the database (0 for
// none, or before River's) and the newest this binary embeds, or
// ErrSchemaNewer, saying which release migrated the database, when the
// first is past the second.
func versions(ctx context.Context, pool *pgxpool.Pool) (applied, latest int64, err error) {
	latest, err = Latest()
	if err != nil {
		return 0, 0, err
	}
	var migrated bool
	err = pool.QueryRow(ctx, `
		SELECT to_regclass('data_manager.schema_migrations') IS NOT NULL
		   AND to_regclass('river_job') IS NOT NULL`).Scan(&migrated)
	if err == nil && migrated {
		err = pool.QueryRow(ctx, `
			SELECT coalesce(max(version_id), 0) FROM data_manager.schema_migrations WHERE is_applied`).Scan(&applied)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("check migrations: %w", err)
	}
	if applied <= latest {
		return applied, latest, nil
	}
	by := "a newer release"
	// Recorded from migration 6 (v0.1.0) on.
	if c, err := etlcontext.ReadCompatibility(ctx, pool); err == nil && c.MigratedBy != nil {
		by = "dama " + *c.MigratedBy
	}
	return 0, 0, fmt.Errorf("%w: it is at version %d, migrated by %s, and this dama %s knows versions up to %d: run %s or later",
		ErrSchemaNewer, applied, by, version.Release, latest, by)
}

// takeMigrateLock waits for the migration lock by trying it again and again
// rather than in pg_advisory_lock: a statement waiting in the server holds a
// snapshot, and CREATE INDEX CONCURRENTLY (migration 5) waits for every older
// snapshot in the database to go, so a second Migrate waiting there would
// wait for the first, and the first for it, forever.
func takeMigrateLock(ctx context.Context, conn *pgxpool.Conn) error {
	for {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", protocol.LockNamespace, migrateLockKey).Scan(&ok); err != nil {
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

// Migrate applies River's migrations and then dama's own, idempotently, then
// creates dama's roles and grants them their rights, as far as the migrating
// role may: CheckRoles says what it could not. It holds a session-level
// advisory lock for the whole run, so that several Migrate calls at once
// (two deploys racing) apply each migration once.
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
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", protocol.LockNamespace, migrateLockKey); err != nil {
			logger.Warn("release migration lock", "error", err)
		}
	}()

	if _, _, err := versions(ctx, pool); err != nil {
		return err
	}

	// River logs each migration it applies, as the loop below does in
	// dama's words: only its warnings pass.
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(warnings{logger.Handler()})})
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

	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+Name); err != nil {
		return fmt.Errorf("create schema %s: %w", Name, err)
	}
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	connConfig := pool.Config().ConnConfig.Copy()
	connConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(lockTimeout.Milliseconds(), 10)
	db := stdlib.OpenDB(*connConfig)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(Name+".schema_migrations"),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("load dama migrations: %w", err)
	}
	applied := len(res.Versions)
	for try := 1; ; try++ {
		results, err := provider.Up(ctx)
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			results = partial.Applied
		}
		for _, r := range results {
			logger.Info("applied dama migration", "version", r.Source.Version, "file", r.Source.Path)
		}
		applied += len(results)
		if err == nil {
			break
		}
		if partial == nil || partial.Failed == nil || partial.Failed.Source == nil {
			return fmt.Errorf("apply dama migrations: %w", err)
		}
		file := partial.Failed.Source.Path
		// lock_not_available: lock_timeout ran out; deadlock_detected: a
		// reader took the migration's locks in the other order, and was
		// let through.
		if code := etlcontext.ErrCode(partial.Err); code != "55P03" && code != "40P01" {
			return fmt.Errorf("apply dama migration %s: %w", file, partial.Err)
		}
		if try < lockTries {
			logger.Warn("a table the migration changes is locked; trying again", "file", file, "try", try, "of", lockTries)
			select {
			case <-ctx.Done():
				return fmt.Errorf("apply dama migration %s: %w", file, ctx.Err())
			case <-time.After(lockRetryPause):
			}
			continue
		}
		what := "nothing of it was applied"
		if noTransaction(file) {
			what = "it may have been applied in part, and is written to be run again"
		}
		return fmt.Errorf("apply dama migration %s: a table it changes stayed locked through %d tries of %s (a long transaction, such as a row-mode task process of an unreleased build); %s: run dama migrate again once that has ended: %w",
			file, lockTries, lockTimeout, what, partial.Err)
	}
	// Only a run that changed something says so: a binary that found
	// nothing to do must not pass for the release that shaped the schema.
	if applied > 0 {
		if err := etlcontext.RecordMigration(ctx, pool, version.Release); err != nil {
			return err
		}
	}
	// Every run, so that the roles' rights cover the tables just added.
	// A role that may not create roles or grant rights leaves that to one
	// that may (CheckRoles says what is missing, EnsureRoles or RolesSQL
	// add it): the roles are optional.
	if err := EnsureRoles(ctx, pool, logger); err != nil && !errors.Is(err, ErrRolesIncomplete) {
		return err
	}
	return nil
}

// warnings passes on Handler's warnings and errors: River's migrator
// tells of each step at Info, which dama's own lines say better.
type warnings struct{ slog.Handler }

func (w warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}

func (w warnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnings{w.Handler.WithAttrs(attrs)}
}

func (w warnings) WithGroup(name string) slog.Handler { return warnings{w.Handler.WithGroup(name)} }
