package supervisor

import (
	"context"
	"fmt"
	"time"

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
//   - wakeSQL makes a snoozed job ('scheduled', or 'available' with a future
//     scheduled_at, as River's snooze leaves it) available now, in the same
//     statement that finds it, which Client.JobRetry cannot do for a batch
//     and would do even to a job that finished meanwhile. It is what River's
//     scheduler does when a job's time comes.

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
	   AND j.state IN ('scheduled', 'available')
	   AND j.scheduled_at > now()
	RETURNING j.id, j.queue`

// parkFor is how long a running task's job is snoozed once its task process
// holds the lock. Nothing needs the job meanwhile: the task's exit wakes it
// (the runner's NOTIFY, or the watch's look at the locks every poll
// interval). The snooze's end is only a backstop, so it costs each running
// task one step an hour.
const parkFor = time.Hour
