package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Compatibility is what the schema accepts of the task processes of older
// releases, and which `dama migrate` last ran on it (the one row of
// data_manager.compatibility).
type Compatibility struct {
	// MinRunnerProtocol is the oldest protocol.Version accepted.
	MinRunnerProtocol int
	// MigratedBy and MigratedAt name the release of the last `dama migrate`
	// and when it ran; nil before any release recorded itself.
	MigratedBy *string
	MigratedAt *time.Time
}

// ErrProtocolRefused is returned by CheckRunnerProtocol when the database no
// longer accepts task processes of the given protocol.
var ErrProtocolRefused = errors.New("the database no longer accepts task processes of this protocol")

// ReadCompatibility reads what the schema accepts.
func ReadCompatibility(ctx context.Context, db DB) (Compatibility, error) {
	c, err := collectOne[Compatibility](ctx, db, `
		SELECT min_runner_protocol, migrated_by, migrated_at FROM data_manager.compatibility`)
	if err != nil {
		return c, fmt.Errorf("read schema compatibility: %w", err)
	}
	return c, nil
}

// CheckRunnerProtocol returns an error wrapping ErrProtocolRefused, saying
// which release retired it, for a protocol the database no longer accepts.
func CheckRunnerProtocol(ctx context.Context, db DB, protocol int) error {
	c, err := ReadCompatibility(ctx, db)
	if err != nil {
		return err
	}
	if protocol >= c.MinRunnerProtocol {
		return nil
	}
	by := "a newer release"
	if c.MigratedBy != nil {
		by = "dama " + *c.MigratedBy
	}
	return fmt.Errorf("%w: this one speaks protocol %d, and the database, migrated by %s, accepts %d and later: run %s or later",
		ErrProtocolRefused, protocol, by, c.MinRunnerProtocol, by)
}

// RecordMigration records that `dama migrate` of release just ran.
func RecordMigration(ctx context.Context, db DB, release string) error {
	if _, err := db.Exec(ctx, `
		UPDATE data_manager.compatibility SET migrated_by = $1, migrated_at = now()`, release); err != nil {
		return fmt.Errorf("record the migrating release: %w", err)
	}
	return nil
}
