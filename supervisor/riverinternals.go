package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river/riverdriver"
)

// This file lists every use dama makes of River's internals: what River
// does not offer through its API, done the way River does it itself. They
// were checked against riverChecked (go.mod pins it); an upgrade of River
// must check them again (TestRiverIsTheVersionChecked fails until it
// does), and TestCreateTaskInsertsTheJobRiverWould compares the job
// data_manager.create_task inserts, and its notification, with River's own.
//
//   - notifyQueue sends River's insert notification (topic "river_insert"),
//     because Client.JobRetry sends none and a woken job would otherwise wait
//     for the next fetch poll.
//   - Every statement dama runs on River's table river_job is in
//     etlcontext/river.go, each with why: waking parked jobs, rescuing the
//     steps and holds of dead or cut-off supervisors without spending an
//     attempt, deleting pruned tasks' jobs, and the reads that join
//     river_job with dama's tables.
//   - A task waiting for a slot has its job parked (snoozed for
//     parkWaiting), and woken by one of those statements when a slot
//     frees. A running task's job is not parked: a Work holds it (work),
//     relying on River's snooze giving the attempt back (a zero snooze
//     makes the job available at once), on a Work's timeout keeping
//     River's rescuer away, and on River's Stop waiting for Work to return.
//   - data_manager.enqueue_job (migration 27), which create_task (migration
//     24) calls for every task, and dama retry and reconcile for a task's
//     new job, is the one INSERT into river_job. It inserts as River's
//     InsertTx inserts a TaskArgs job: args {"etl_context_id", "kind"},
//     kind dama_task, priority 1, metadata and tags empty, state available
//     (scheduled until the task is due), the id from River's sequence (the
//     column's default), and River's insert notification on "<River's
//     schema>.river_insert" with {"queue": ...}, which River's producers
//     listen to; but at the context's attempt, which InsertOpts cannot
//     set. So a program in any language submits without a River client.
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

// riverChecked is the River release the internals below were checked
// against.
const riverChecked = "v0.51.1"

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

// parkWaiting is how long the job of a task waiting for a slot is snoozed.
// Nothing needs the job meanwhile: a freed slot wakes it (wakeWaiting, also
// every poll interval), so the snooze's end is only a backstop, costing
// each waiting task one step an hour.
const parkWaiting = time.Hour
