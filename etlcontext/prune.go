package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pruned counts what one Prune removed.
type Pruned struct {
	Tasks, Events, Attempts, Jobs int64
}

// Add returns the sum of p and o.
func (p Pruned) Add(o Pruned) Pruned {
	return Pruned{Tasks: p.Tasks + o.Tasks, Events: p.Events + o.Events, Attempts: p.Attempts + o.Attempts, Jobs: p.Jobs + o.Jobs}
}

// PruneLimits bound what one transaction of Prune removes, so that each
// is short and locks few rows (a task stored before progress was sampled
// may hold hundreds of thousands of events). A tree larger than either is
// removed alone.
type PruneLimits struct {
	// Tasks bounds the tasks, and Events their events; 0 means the default,
	// 500 and 50,000.
	Tasks  int
	Events int64
}

// pruneRoot is a root Prune looks at, in the order of the roots: their end,
// then their id; the last one of a transaction is where the next begins.
type pruneRoot struct {
	At time.Time
	ID int64
}

// Prune removes whole trees of finished tasks (a task with no parent and
// every task below it), each finished more than olderThan ago by the
// database's clock and with its River job settled (finalized, or gone),
// oldest first, with their events, attempts and jobs, in transactions of
// at most limits (but a tree whatever its size). A tree not all finished
// stays, so that a parent still counts its children and a retried parent
// finds the children it submitted. Trees another Prune holds are skipped,
// so that supervisors prune side by side. data_manager.remove_tasks
// (migration 23) removes them, and refuses anything but whole finished
// trees. Prune returns what it removed, also when ctx ends or an error
// stops it.
func Prune(ctx context.Context, db Beginner, olderThan time.Duration, limits PruneLimits) (Pruned, error) {
	if limits.Tasks <= 0 {
		limits.Tasks = 500
	}
	if limits.Events <= 0 {
		limits.Events = 50000
	}
	var may bool
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT has_function_privilege('data_manager.remove_tasks(bigint[])', 'EXECUTE')`).Scan(&may)
	}); err != nil {
		return Pruned{}, fmt.Errorf("read whether this role may remove tasks: %w", err)
	}
	if !may {
		return Pruned{}, errors.New("this role may not remove tasks: it takes dama_supervisor (EXECUTE on data_manager.remove_tasks)")
	}
	var (
		total Pruned
		after pruneRoot
	)
	for {
		p, next, err := pruneOnce(ctx, db, olderThan, limits, after)
		total = total.Add(p)
		if err != nil || next == nil {
			return total, err
		}
		after = *next
	}
}

// errPruneRace rolls back a transaction of Prune whose trees changed
// between weighing and removal (a member retried meanwhile).
var errPruneRace = errors.New("a tree changed while it was being removed")

// pruneOnce is one transaction of Prune, from the roots after after; it
// returns the last root it looked at, nil when no root was left.
func pruneOnce(ctx context.Context, db Beginner, olderThan time.Duration, limits PruneLimits, after pruneRoot) (Pruned, *pruneRoot, error) {
	var (
		p    Pruned
		next *pruneRoot
	)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		roots, err := collect[pruneRoot](ctx, tx, `
			SELECT c.finished_at, c.etl_context_id
			  FROM data_manager.etl_contexts AS c
			  LEFT JOIN river_job AS j ON j.id = c.river_job_id
			 WHERE c.parent_context_id IS NULL
			   AND c.finished_at < now() - make_interval(secs => $1) AND c.etl_status IN `+sqlFinished+`
			   AND (c.finished_at, c.etl_context_id) > ($3, $4)
			   AND (j.id IS NULL OR j.state IN `+jobFinalized+`)
			 ORDER BY c.finished_at, c.etl_context_id
			 LIMIT $2`, olderThan.Seconds(), limits.Tasks, after.At, after.ID)
		if err != nil {
			return fmt.Errorf("find finished tasks to remove: %w", err)
		}
		var (
			remove, jobs []int64
			events       int64
		)
		// One tree at a time, oldest first, until the limits: each root
		// is locked (or skipped, when another Prune holds it) and read
		// again once locked, its tree weighed no further than the events
		// left to the limit.
		for _, r := range roots {
			var (
				members, js []int64
				removable   bool
				treeEvents  int64
			)
			err := tx.QueryRow(ctx, `
				WITH RECURSIVE locked AS (
				    SELECT c.etl_context_id FROM data_manager.etl_contexts AS c
				     WHERE c.etl_context_id = $1 AND c.parent_context_id IS NULL AND c.etl_status IN `+sqlFinished+`
				       FOR UPDATE SKIP LOCKED),
				tree AS (
				    SELECT etl_context_id AS id FROM locked
				    UNION ALL
				    SELECT k.etl_context_id FROM tree AS t
				      JOIN data_manager.etl_contexts AS k ON k.parent_context_id = t.id),
				weighed AS (
				    SELECT array_agg(t.id) AS members,
				           coalesce(array_agg(c.river_job_id) FILTER (WHERE c.river_job_id IS NOT NULL), '{}') AS jobs,
				           bool_and(c.etl_status IN `+sqlFinished+` AND c.finished_at < now() - make_interval(secs => $2)
				                    AND (c.river_job_id IS NULL OR j.id IS NULL OR j.state IN `+jobFinalized+`)) AS removable
				      FROM tree AS t
				      JOIN data_manager.etl_contexts AS c ON c.etl_context_id = t.id
				      LEFT JOIN river_job AS j ON j.id = c.river_job_id)
				SELECT coalesce(w.members, '{}'), w.jobs, coalesce(w.removable, false),
				       CASE WHEN coalesce(w.removable, false)
				            THEN (SELECT count(*) FROM (SELECT 1 FROM data_manager.event_store AS e
				                                         WHERE e.etl_context_id = ANY(w.members) LIMIT $3) AS x)
				            ELSE 0 END
				  FROM weighed AS w`, r.ID, olderThan.Seconds(), limits.Events-events+1).Scan(&members, &js, &removable, &treeEvents)
			if err != nil {
				return fmt.Errorf("read the tree of finished task %d: %w", r.ID, err)
			}
			if removable && len(remove) > 0 && (len(remove)+len(members) > limits.Tasks || events+treeEvents > limits.Events) {
				break
			}
			next = &r
			if removable {
				remove, jobs, events = append(remove, members...), append(jobs, js...), events+treeEvents
			}
		}
		if len(remove) == 0 {
			return nil
		}
		if err := tx.QueryRow(ctx, `SELECT tasks, events, attempts FROM data_manager.remove_tasks($1)`, remove).Scan(&p.Tasks, &p.Events, &p.Attempts); err != nil {
			if ErrCode(err) == "DMPRU" {
				p = Pruned{}
				return errPruneRace
			}
			return fmt.Errorf("remove %d finished tasks: %w", len(remove), classify(err))
		}
		p.Jobs, err = deleteFinishedJobs(ctx, tx, jobs)
		return err
	})
	switch {
	case errors.Is(err, errPruneRace):
		// Nothing of this transaction was removed; its trees are looked
		// at again by the next Prune.
		return Pruned{}, next, nil
	case err != nil:
		return Pruned{}, nil, err
	}
	return p, next, nil
}
