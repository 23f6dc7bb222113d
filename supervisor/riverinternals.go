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
//   - A running task's job is held by a Work (work), relying on a zero
//     snooze giving the attempt back and making the job available at once,
//     on a Work's timeout keeping River's rescuer away, and on River's Stop
//     waiting for Work to return.
//   - data_manager.enqueue_job (migration 27), the one INSERT into
//     river_job, inserts as River's InsertTx inserts a TaskArgs job, and
//     sends River's insert notification, but at the context's attempt,
//     which InsertOpts cannot set: so a program in any language submits
//     without a River client.
//   - Migration 19's trigger on river_job keeps a member of dama_task to
//     inserting its own children's jobs, as River's InsertTx inserts them.
//     River's inserts must still set what it reads (kind, state, attempt,
//     attempted_at, args.etl_context_id), and draw a job's id with nextval
//     in the inserting statement (v0.51.1: coalesce(nullif(id, 0),
//     nextval(...))), which it compares with currval.
//   - riverTail (logfilter.go) knows the messages of River's completer's
//     tries, and that a batch it gave up on is tried again at its next
//     tick, so that an outage's failed completions are said by the
//     outage's two lines, and completed after it.

// riverChecked is the River release the internals here were checked against.
const riverChecked = "v0.51.1"

// notifyQueue tells every supervisor's River producer of the queue that a job
// is available, as River itself does after an insert.
func (s *Supervisor) notifyQueue(ctx context.Context, queue string) {
	if err := s.river.Driver().GetExecutor().NotifyMany(ctx, &riverdriver.NotifyManyParams{
		Topic:   "river_insert",
		Payload: []string{fmt.Sprintf(`{"queue": %q}`, queue)},
	}); err != nil {
		s.logger.Warn("tell the queue's supervisors that a task is ready", "queue", queue, "error", err)
	}
}

// parkWaiting is how long the job of a task waiting for a slot is snoozed:
// a freed slot wakes it (wakeWaiting), so this is only a backstop.
const parkWaiting = time.Hour
