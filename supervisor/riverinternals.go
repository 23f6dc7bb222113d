package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/riverdriver"
)

// This file holds every use dama makes of River's internals: what River
// does not offer through its API, done the way River does it itself. They
// were checked against River v0.51.1 (go.mod pins it); an upgrade of River
// must check them again.
//
//   - notifyQueue sends River's insert notification (topic "river_insert"),
//     because Client.JobRetry sends none and a woken job would otherwise wait
//     for the next fetch poll.
//   - rescueSQL makes a job that a dead supervisor left 'running' available
//     again with its attempt given back (state 'available', attempt - 1):
//     what River's own snooze does, without River's rescuer spending an
//     attempt or discarding the job an hour later.
//   - alignAttempt gives a retried task's new job (dama retry) the task's
//     attempt count, which InsertOpts cannot set: a step compares River's
//     attempt with the context's to tell a failure River has counted from
//     one it has not.
//   - wakeSQL makes a parked job ('scheduled': River's snooze leaves a job
//     snoozed beyond its scheduler interval, 5s, so) available now, in the
//     same statement that finds it, which Client.JobRetry cannot do for a
//     batch and would do even to a job that finished meanwhile. It is what
//     River's scheduler does when a job's time comes. A job 'available'
//     with a future scheduled_at is left alone: River leaves so both a
//     short snooze and a short retry backoff, and a retry must wait out
//     its kind's backoff.
//
// And in the schema, on River's table: migration 19 puts a trigger on
// river_job (BEFORE INSERT OR UPDATE OF kind) that keeps a member of
// dama_task to inserting its own children's jobs, as River inserts them,
// and changing none. Its right to update kind is what River's InsertTx
// asks for (INSERT ... ON CONFLICT DO UPDATE SET kind): dama's jobs carry
// no unique key, so that update never happens. For every other role the
// trigger asks who writes, once per job inserted. (Not row-level
// security: that made River's fetch, whose state condition is not
// leakproof, scan the whole table, and refused COPY.) An upgrade of River
// must check that its inserts still set what the trigger reads (kind,
// state, attempt, attempted_at, args.etl_context_id), and still draw a
// job's id with nextval in the inserting statement (River v0.51.1:
// coalesce(nullif(id, 0), nextval(...))), which the trigger compares with
// currval. The trigger asks who writes of pg_catalog alone, so another
// program's River client with no right on data_manager still inserts; a
// COPY into river_job (InsertManyFast) then inserts row by row.

// notifyQueue tells every supervisor's River producer of the queue that a job
// is available, as River itself does after an insert.
func (s *Supervisor) notifyQueue(ctx context.Context, queue string) {
	if err := s.river.Driver().GetExecutor().NotifyMany(ctx, &riverdriver.NotifyManyParams{
		Topic:   "river_insert",
		Payload: []string{fmt.Sprintf(`{"queue": %q}`, queue)},
	}); err != nil {
		s.logger.Warn("notify queue", "queue", queue, "error", err)
	}
}

// rescueSQL is the assignment of a rescue (see rescueOrphanedSteps).
const rescueSQL = `state = 'available', attempt = greatest(j.attempt - 1, 0), scheduled_at = now()`

// wakeSQL, given a relation "due(id)" of job ids, makes those of them that
// wait for a future time available now and returns their id and queue.
const wakeSQL = `UPDATE river_job AS j
	   SET state = 'available', scheduled_at = now()
	  FROM due
	 WHERE j.id = due.id
	   AND j.state = 'scheduled'
	   AND j.scheduled_at > now()
	RETURNING j.id, j.queue`

// parkFor is how long a running task's job is snoozed once its task process
// holds the lock. Nothing needs the job meanwhile: the task's exit wakes it
// (the runner's NOTIFY, or the watch's look at the locks every poll
// interval). The snooze's end is only a backstop, so it costs each running
// task one step an hour.
const parkFor = time.Hour

// alignAttempt sets the attempt count of job, inserted in tx and not yet
// fetched, to attempt.
func alignAttempt(ctx context.Context, tx pgx.Tx, job int64, attempt int) error {
	if _, err := tx.Exec(ctx, `UPDATE river_job SET attempt = $2 WHERE id = $1 AND state = 'available' AND attempted_at IS NULL`, job, attempt); err != nil {
		return fmt.Errorf("align attempt of job %d: %w", job, err)
	}
	return nil
}
