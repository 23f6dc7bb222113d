package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dama-etl/dama/protocol"
	"github.com/jackc/pgx/v5"
)

// This file holds every statement dama runs on River's table river_job,
// each with why: what River's API (which the supervisor calls to insert,
// cancel and retry a job) does not offer is done here the way River does it
// itself. They were checked against River v0.51.1 (go.mod pins it): an
// upgrade of River must check them again, and the list of River internals
// in supervisor/riverinternals.go. The writes are wakeJobs, rescueJob,
// EnqueueJob and deleteFinishedJobs; Watch, Disagreements, LockJobless,
// AbandonedSteps, JobRun and Prune read a job's state, queue, attempt, last
// client and times.

// JobKind is the River kind of every dama job: one job per task, whose
// work is a step of the task (supervisor.TaskArgs).
const JobKind = "dama_task"

// River's job states, as the statements below name them.
const (
	jobAvailable = "'available'"
	jobScheduled = "'scheduled'"
	jobRunning   = "'running'"
	jobFinalized = "('completed', 'cancelled', 'discarded')"
)

// wakeJobs, given a relation "due(id)" of job ids, makes those of them that
// wait for a future time available now and returns their id and queue: what
// River's scheduler does when a job's time comes, for a job parked waiting
// for a slot ('scheduled': River's snooze leaves a job snoozed beyond its
// scheduler interval, 5s, so), in the statement that finds it, which
// Client.JobRetry cannot do for a batch and would do even to a job that
// finished meanwhile. A job 'available' with a future scheduled_at is left
// alone: River leaves so both a short snooze and a short retry backoff, and
// a retry must wait out its kind's backoff.
const wakeJobs = `UPDATE river_job AS j
	   SET state = ` + jobAvailable + `, scheduled_at = now()
	  FROM due
	 WHERE j.id = due.id
	   AND j.state = ` + jobScheduled + `
	   AND j.scheduled_at > now()
	RETURNING j.id, j.queue`

// rescueJob is the assignment of a rescue of a job that a dead or cut-off
// supervisor left 'running': available again, its attempt given back, as
// River's own snooze does, without River's rescuer waiting an hour,
// spending an attempt or discarding the job.
const rescueJob = `state = ` + jobAvailable + `, attempt = greatest(j.attempt - 1, 0), scheduled_at = now()`

// heldAdvisory is true for a row l of pg_locks that is a two-int advisory
// lock of namespace, held in the current database. Reading pg_locks takes
// no lock and fails nothing.
func heldAdvisory(namespace int) string {
	return `l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
	   AND l.classid = ` + strconv.Itoa(namespace) + `::oid
	   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())`
}

// heldLocks is a query, usable as a CTE, of the ids of the contexts whose
// lock is held.
func heldLocks() string {
	return `SELECT l.objid::bigint AS etl_context_id
	  FROM pg_catalog.pg_locks AS l WHERE ` + heldAdvisory(protocol.LockNamespace)
}

// Watched is what Watch found.
type Watched struct {
	// Look are the contexts, in the queues, that a step must look at.
	Look []int64
	// Woken counts the parked jobs it woke.
	Woken int
	// FreeHere are the RUNNING contexts on the host whose lock is free,
	// whoever steps them.
	FreeHere []int64
}

// Watch is a supervisor's look at every task, in one statement whose cost
// does not depend on how many tasks run quietly, from pg_locks. In queues,
// it finds the contexts a step must look at (Watched.Look): those whose
// lock is free while they are RUNNING (their process died, lost its lock or
// never took it), or while their job still runs (they ended, or their
// attempt failed, unheard), and wakes such a context's job parked by a
// release before v0.2.0 (which snoozed a running task's job for an hour).
func Watch(ctx context.Context, db DB, queues []string, hostID string) (Watched, error) {
	var w Watched
	err := db.QueryRow(ctx, `
		WITH held AS (`+heldLocks()+`),
		free AS (
			SELECT c.etl_context_id, c.queue, c.host_id
			  FROM data_manager.etl_contexts AS c
			 WHERE c.etl_status = `+sqlRunning+`
			   AND (c.queue = ANY($1) OR c.host_id = $2)
			   AND c.etl_context_id NOT IN (SELECT etl_context_id FROM held)),
		ended AS (
			SELECT c.etl_context_id
			  FROM river_job AS j
			  JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
			 WHERE j.state = `+jobRunning+`
			   AND j.queue = ANY($1)
			   AND j.kind = $3
			   AND c.etl_status <> `+sqlRunning+`
			   AND c.etl_context_id NOT IN (SELECT etl_context_id FROM held)),
		parked AS (
			SELECT j.id
			  FROM river_job AS j
			  JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
			 WHERE j.state = `+jobScheduled+`
			   AND j.queue = ANY($1)
			   AND j.kind = $3
			   AND j.scheduled_at > now()
			   AND c.etl_context_id NOT IN (SELECT etl_context_id FROM held)
			   AND (c.etl_status = `+sqlRunning+` OR c.etl_status IN `+sqlFinished+`
			        -- River's attempt counter lags one behind while the job
			        -- waits: the attempt it launched has failed.
			        OR (c.etl_status = `+sqlRetrying+` AND c.attempt > j.attempt))),
		due AS (SELECT id FROM parked),
		woken AS (`+wakeJobs+`)
		SELECT ARRAY(SELECT etl_context_id FROM free WHERE queue = ANY($1)
		             UNION ALL SELECT etl_context_id FROM ended),
		       (SELECT count(*) FROM woken),
		       ARRAY(SELECT etl_context_id FROM free WHERE host_id = $2)`,
		queues, hostID, JobKind).Scan(&w.Look, &w.Woken, &w.FreeHere)
	if err != nil {
		return Watched{}, fmt.Errorf("look for tasks whose lock is free: %w", err)
	}
	return w, nil
}

// QueueRoom is what WakeWaitingJobs needs of a queue's configuration.
type QueueRoom struct {
	Queue      string
	MaxRunning int
	// Kinds are every configured kind, with their max_running and
	// max_running_per_key (0: no limit).
	Kinds               []string
	KindMax, KindKeyMax []int32
}

// WakeWaitingJobs wakes the parked jobs of the queue's due tasks that wait
// for a slot and would find one now (wakeWaiting), and returns how many.
func WakeWaitingJobs(ctx context.Context, db DB, q QueueRoom) (int, error) {
	var n int
	err := db.QueryRow(ctx, `
		WITH due AS (`+wakeWaiting+`),
		woken AS (`+wakeJobs+`)
		SELECT count(*) FROM woken`, q.Queue, q.MaxRunning, q.Kinds, q.KindMax, q.KindKeyMax).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("wake the tasks of queue %s waiting for a slot: %w", q.Queue, err)
	}
	return n, nil
}

// Disagreement is a context whose job says otherwise (Disagreements).
type Disagreement struct {
	ID          int64
	Queue, Kind string
	MaxAttempts int
	// Job is the context's job, or nil when it is gone.
	Job *int64
}

// Disagreements finds, in queues, what no step sees, as none runs once a
// job is finished: a context not finished while its River job is (or is
// gone), or a finished context whose job ended in a state that says
// otherwise, which happen only behind dama's back (River's own rescuer after
// all supervisors were down for an hour, a job cancelled or deleted by hand).
func Disagreements(ctx context.Context, db DB, queues []string) ([]Disagreement, error) {
	found, err := collect[Disagreement](ctx, db, `
		SELECT c.etl_context_id, c.queue, c.kind, c.max_attempts, j.id
		  FROM data_manager.etl_contexts AS c
		  LEFT JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_status NOT IN `+sqlFinished+`
		   AND c.queue = ANY($1)
		   AND (j.id IS NULL OR j.state IN `+jobFinalized+`)
		UNION ALL
		-- Finished contexts are many; only recently finalized jobs can
		-- disagree with theirs (River deletes old finalized jobs anyway).
		SELECT c.etl_context_id, c.queue, c.kind, c.max_attempts, j.id
		  FROM river_job AS j
		  JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
		 WHERE j.state IN `+jobFinalized+`
		   AND j.finalized_at > now() - interval '1 day'
		   AND c.queue = ANY($1)
		   AND CASE c.etl_status
		         WHEN `+sqlDone+` THEN j.state <> 'completed'
		         WHEN `+sqlCancelled+` THEN j.state <> 'cancelled'
		         -- A FAILED context's job is discarded, or cancelled when it
		         -- was retried after the context had failed.
		         WHEN `+sqlFailed+` THEN j.state = 'completed'
		         ELSE false
		       END`, queues)
	if err != nil {
		return nil, fmt.Errorf("find contexts that disagree with their jobs: %w", err)
	}
	return found, nil
}

// LockJobless locks context id's row, in tx until it ends, and reports
// whether the context still has no job. Concurrent callers take turns on
// the row lock, held until the job is recorded (EnqueueJob) and committed,
// so whoever comes second sees the job the first committed. The check is a
// statement of its own, run once the lock is granted: under READ COMMITTED
// one inside the locking statement would re-read the context's new
// river_job_id yet miss the job it names, committed after it began.
func LockJobless(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	var current *int64
	if err := tx.QueryRow(ctx, `
		SELECT river_job_id FROM data_manager.etl_contexts WHERE etl_context_id = $1 FOR UPDATE`,
		id).Scan(&current); err != nil {
		return false, fmt.Errorf("lock task %d: %w", id, classify(err))
	}
	if current == nil {
		return true, nil
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE id = $1)`, *current).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for job %d: %w", *current, err)
	}
	return !exists, nil
}

// EnqueueJob gives context id a new River job, in tx, and returns it, by
// data_manager.enqueue_job (migration 27), the one INSERT into river_job,
// with which create_task makes every task's job: as River's InsertTx would,
// but at the context's attempt, which InsertOpts cannot set, and due when
// the context is.
func EnqueueJob(ctx context.Context, tx pgx.Tx, id int64) (int64, error) {
	var job int64
	if err := tx.QueryRow(ctx, `SELECT data_manager.enqueue_job($1)`, id).Scan(&job); err != nil {
		return 0, fmt.Errorf("enqueue a River job for task %d: %w", id, classify(err))
	}
	return job, nil
}

// JobRun reports whether job is running, and since when (its last fetch):
// a Work whose job was fetched again since it began was taken over.
func JobRun(ctx context.Context, db DB, job int64) (JobState, error) {
	j, err := collectOne[jobRow](ctx, db,
		`SELECT j.state = `+jobRunning+`, j.attempted_at FROM river_job AS j WHERE j.id = $1`, job)
	if errors.Is(err, pgx.ErrNoRows) {
		return JobState{}, nil
	}
	if err != nil {
		return JobState{}, fmt.Errorf("read job %d: %w", job, err)
	}
	return j.state(), nil
}

// Rescued is a job a rescue made available again, and its task.
type Rescued struct {
	ID    int64
	Queue string
	Task  int64
}

// RescueStaleSteps rescues the steps that started more than olderThan ago
// and still run: surely dead.
func RescueStaleSteps(ctx context.Context, db DB, olderThan time.Duration) ([]Rescued, error) {
	rescued, err := collect[Rescued](ctx, db, `
		UPDATE river_job AS j
		   SET `+rescueJob+`
		 WHERE j.kind = $1
		   AND j.state = `+jobRunning+`
		   AND j.attempted_at < now() - $2::interval
		RETURNING j.id, j.queue, `+jobTask, JobKind, olderThan)
	if err != nil {
		return nil, fmt.Errorf("rescue steps older than %s: %w", olderThan, err)
	}
	return rescued, nil
}

// Step is a running step of a job: the job, the client that last fetched
// it, and when (a job fetched again is another step).
type Step struct {
	JobID       int64
	Client      string
	AttemptedAt time.Time
	// Old: fetched longer ago than the caller's answer wait, by the
	// database's clock; Abandoned: see AbandonedSteps.
	Old, Abandoned bool
	// The host and pid the client recorded as its supervisor's
	// (data_manager.supervisors), empty and 0 when it recorded none.
	HostID string
	PID    int
}

// abandoned is true for a running river_job row j that nobody looks after:
// its last client holds no liveness lock (ClientLockNamespace) in this
// database, or it holds the job of a task whose lock is free while the task
// is RUNNING with a process recorded, or ended. A live client pokes such a
// job within a poll interval (its watch), so a job seen so for the rescue
// grace is held by a client cut off from the database, whose liveness
// session the server may keep for as long as TCP keepalives allow.
func abandoned() string {
	return `(NOT EXISTS (
	SELECT 1 FROM pg_catalog.pg_locks AS l
	 WHERE ` + heldAdvisory(ClientLockNamespace) + ` AND l.objid = hashtext(` + lastClient + `)::oid)
	OR EXISTS (
	SELECT 1 FROM data_manager.etl_contexts AS c
	 WHERE c.river_job_id = j.id
	   AND ((c.etl_status = ` + sqlRunning + ` AND c.pid IS NOT NULL) OR c.etl_status <> ` + sqlRunning + `)
	   AND c.etl_status <> ` + sqlQueued + `
	   AND c.etl_context_id NOT IN (` + heldLocks() + `)))`
}

// jobTask is the etl_context_id of river_job row j's task (0 for none).
const jobTask = `coalesce((j.args->>'etl_context_id')::bigint, 0)`

// lastClient is the client that last fetched river_job row j.
const lastClient = `j.attempted_by[array_length(j.attempted_by, 1)]`

// AbandonedSteps finds the running steps and holds that nobody looks after
// (abandoned), begun over a second ago (which leaves alone a client taking
// its lock at startup): Abandoned; and every running step that own, the
// caller's River client, fetched, for only the caller can tell whether a
// Work of its own has it (a fetch whose answer was lost leaves a job
// running under a live client that never received it).
func AbandonedSteps(ctx context.Context, db DB, own string, answerWait time.Duration) ([]Step, error) {
	steps, err := collect[Step](ctx, db, `
		SELECT s.*, coalesce(sup.host_id, ''), coalesce(sup.pid, 0)
		  FROM (SELECT j.id, coalesce(`+lastClient+`, '') AS client, j.attempted_at,
		               j.attempted_at < now() - $3::interval,
		               j.attempted_at < now() - interval '1 second' AND `+abandoned()+` AS abandoned
		          FROM river_job AS j
		         WHERE j.kind = $1
		           AND j.state = `+jobRunning+`) AS s
		  LEFT JOIN data_manager.supervisors AS sup ON sup.client_id = s.client
		 WHERE s.client = $2 OR s.abandoned`, JobKind, own, answerWait)
	if err != nil {
		return nil, fmt.Errorf("find running steps nobody looks after: %w", err)
	}
	return steps, nil
}

// RescueSteps rescues those of steps that still run, under the same
// attempt, and are still abandoned or fetched by own, the caller's River
// client, which found that none of its Works has them: that is looked at
// once more, in the statement that rescues.
func RescueSteps(ctx context.Context, db DB, own string, steps []Step) ([]Rescued, error) {
	ids := make([]int64, len(steps))
	ats := make([]time.Time, len(steps))
	for i, s := range steps {
		ids[i], ats[i] = s.JobID, s.AttemptedAt
	}
	rescued, err := collect[Rescued](ctx, db, `
		UPDATE river_job AS j
		   SET `+rescueJob+`
		  FROM unnest($2::bigint[], $3::timestamptz[]) AS due(id, attempted_at)
		 WHERE j.id = due.id
		   AND j.attempted_at = due.attempted_at
		   AND j.kind = $1
		   AND j.state = `+jobRunning+`
		   AND (`+lastClient+` = $4 OR `+abandoned()+`)
		RETURNING j.id, j.queue, `+jobTask, JobKind, ids, ats, own)
	if err != nil {
		return nil, fmt.Errorf("rescue steps of dead supervisors: %w", err)
	}
	return rescued, nil
}

// deleteFinishedJobs deletes, in tx, those of jobs that are finished, as
// River's JobDeleteMany would, and returns how many it deleted.
func deleteFinishedJobs(ctx context.Context, tx pgx.Tx, jobs []int64) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM river_job WHERE id = ANY($1) AND state IN `+jobFinalized, jobs)
	if err != nil {
		return 0, fmt.Errorf("remove the River jobs of %d finished tasks: %w", len(jobs), err)
	}
	return tag.RowsAffected(), nil
}
