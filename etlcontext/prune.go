package etlcontext

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pruningSetting is the transaction setting by which Prune tells the
// database that it removes finished tasks' events (migration 22): nothing
// else may delete an event.
const pruningSetting = "dama.pruning"

// Pruned counts what one Prune removed.
type Pruned struct {
	Tasks, Events, Attempts, Jobs int64
}

// Add returns the sum of p and o.
func (p Pruned) Add(o Pruned) Pruned {
	return Pruned{Tasks: p.Tasks + o.Tasks, Events: p.Events + o.Events, Attempts: p.Attempts + o.Attempts, Jobs: p.Jobs + o.Jobs}
}

// Prune removes, in one short transaction, up to limit tasks that finished
// more than olderThan ago, by the database's clock, and have no child left, oldest first, with their events,
// attempts and River job (when it is finalized; jobs an earlier dama retry
// left are River's cleaner's). A task that is running, waiting or to be
// retried is never removed, nor a parent while any of its children is
// kept: the children go first, and their parent with a later call. Tasks
// another Prune holds are skipped, so that supervisors prune side by side.
// Call it until it removes fewer than limit.
func Prune(ctx context.Context, db Beginner, olderThan time.Duration, limit int) (Pruned, error) {
	var p Pruned
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var ids, jobs []int64
		// Locked, and so checked again once locked: a task retried or
		// given a child meanwhile is no longer one to remove.
		rows, err := tx.Query(ctx, `
			SELECT c.etl_context_id, c.river_job_id
			  FROM data_manager.etl_contexts AS c
			 WHERE c.finished_at < now() - make_interval(secs => $1) AND c.etl_status IN `+sqlFinished+`
			   AND NOT EXISTS (SELECT 1 FROM data_manager.etl_contexts AS k WHERE k.parent_context_id = c.etl_context_id)
			 ORDER BY c.finished_at
			 LIMIT $2
			   FOR UPDATE OF c SKIP LOCKED`, olderThan.Seconds(), limit)
		if err != nil {
			return fmt.Errorf("find finished tasks to remove: %w", err)
		}
		for rows.Next() {
			var id int64
			var job *int64
			if err := rows.Scan(&id, &job); err != nil {
				rows.Close()
				return fmt.Errorf("find finished tasks to remove: %w", err)
			}
			ids = append(ids, id)
			if job != nil {
				jobs = append(jobs, *job)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("find finished tasks to remove: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `SELECT set_config($1, 'on', true)`, pruningSetting); err != nil {
			return fmt.Errorf("remove finished tasks: %w", err)
		}
		for _, step := range []struct {
			n    *int64
			what string
			sql  string
			arg  []int64
		}{
			{&p.Events, "events", `DELETE FROM data_manager.event_store WHERE etl_context_id = ANY($1)`, ids},
			{&p.Attempts, "attempts", `DELETE FROM data_manager.etl_attempts WHERE etl_context_id = ANY($1)`, ids},
			{&p.Jobs, "River jobs", `DELETE FROM river_job WHERE id = ANY($1) AND state IN ` + jobFinalized, jobs},
			{&p.Tasks, "contexts", `DELETE FROM data_manager.etl_contexts WHERE etl_context_id = ANY($1)`, ids},
		} {
			tag, err := tx.Exec(ctx, step.sql, step.arg)
			if err != nil {
				return fmt.Errorf("remove the %s of %d finished tasks: %w", step.what, len(ids), err)
			}
			*step.n = tag.RowsAffected()
		}
		return nil
	})
	if err != nil {
		return Pruned{}, err
	}
	return p, nil
}
