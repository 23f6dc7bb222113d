package supervisor

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/dama-etl/dama/etlcontext"
)

// stepTimeout bounds a step: its launch wait plus a margin for its queries.
func stepTimeout(launch time.Duration) time.Duration { return launch + 20*time.Second }

// holdFor bounds how long one Work holds the job of a running task before
// it gives the job back (a zero snooze). The Work's timeout is under an hour,
// River's default RescueStuckJobsAfter: no rescuer takes a held job for stuck.
const holdFor = 30 * time.Minute

// workTimeout is River's timeout of a Work: a hold and the steps around it.
func workTimeout(launch time.Duration) time.Duration { return holdFor + 3*stepTimeout(launch) }

// Sentinels a step returns to its Work (never to River).
var (
	// errHold: the task's process holds its lock; hold the job until it ends.
	errHold = errors.New("task running: hold its job")
	// errStepAgain: the launch ended without a running task: step again.
	errStepAgain = errors.New("step again")
	// errNeedsLock: the step must keep the task's lock while it decides:
	// step again in a transaction.
	errNeedsLock = errors.New("step again holding the lock")
	// errTakenOver: another Work fetched the job since this one began (outlive).
	errTakenOver = errors.New("job taken over by another Work")
)

// TaskArgs are the arguments of the one River job that follows a context
// through its whole life. The task's own arguments live in the context's
// INITIAL event, not in the job. data_manager.enqueue_job (migration 27)
// inserts every job, with these arguments.
type TaskArgs struct {
	ETLContextID int64 `json:"etl_context_id"`
	// TaskKind is the task's kind, for the kind's retry policy (NextRetry);
	// empty in the jobs of releases before it, which then back off as
	// River does by default.
	TaskKind string `json:"kind,omitempty"`
}

// Kind is the River job kind of every dama task.
func (TaskArgs) Kind() string { return etlcontext.JobKind }

// taskWorker is River's view of a task (see work).
type taskWorker struct {
	river.WorkerDefaults[TaskArgs]
	s *Supervisor
}

func (w *taskWorker) Work(ctx context.Context, job *river.Job[TaskArgs]) error {
	return w.s.work(ctx, job)
}

// NextRetry applies the kind's retry policy after a failed attempt (the
// step returns an error only then); zero means River's default backoff.
func (w *taskWorker) NextRetry(job *river.Job[TaskArgs]) time.Time {
	if k, ok := w.s.cfg.Kind(job.Args.TaskKind); ok {
		if d := k.RetryDelay(job.Attempt); d != 0 {
			return time.Now().Add(d)
		}
	}
	return time.Time{}
}

func (w *taskWorker) Timeout(*river.Job[TaskArgs]) time.Duration {
	return workTimeout(w.s.opts.LaunchTimeout)
}

// work steps the task of job and, while its task process holds the lock,
// holds the job, on no connection, until the task's end pokes it (the
// supervisor reaping its runner, a runner's NOTIFY, the watch). A stopping
// supervisor, or one holding for holdFor, gives the job back.
func (s *Supervisor) work(ctx context.Context, job *river.Job[TaskArgs]) error {
	if !s.begin(job) {
		// Given back as a lost fetch's: another Work may hold the job now.
		return s.outlive(ctx, job)
	}
	if s.retired.Load() {
		// Leave the task to a newer supervisor.
		return river.JobSnooze(time.Duration(s.cfg.PollInterval))
	}
	id := job.Args.ETLContextID
	poked := s.holding(id)
	defer s.released(id, poked)
	giveBack := time.NewTimer(holdFor)
	defer giveBack.Stop()
	// held: this Work has held its task; holding: its last step found the
	// task holding its lock; poked2: the times of the last two steps a poke
	// caused, the older first.
	again, held, holding := 0, false, false
	var poked2 [2]time.Time
	for {
		err := s.stepInSlot(ctx, job, holding)
		holding = false
		switch {
		case errors.Is(err, errTakenOver):
			return s.outlive(ctx, job)
		case errors.Is(err, errStepAgain) && again < 2:
			again++
			continue
		case errors.Is(err, errStepAgain):
			err = river.JobSnooze(time.Duration(s.cfg.PollInterval))
		case errors.Is(err, errHold):
			again, held, holding = 0, true, true
			if err = s.awaitPoke(ctx, poked, giveBack.C, &poked2); err == nil {
				continue
			}
		case held:
			// The task ended: its slot is free.
			s.wakeWaiting(context.WithoutCancel(ctx), job.Queue)
		}
		// A snooze (a hold given back, a step that failed or was cut short
		// by the stop) of a job another Work has taken over returns only
		// once that one is done with the job. A step that locked its task
		// looked already.
		var snooze *rivertype.JobSnoozeError
		if errors.As(err, &snooze) && s.takenOver(ctx, job) {
			return s.outlive(ctx, job)
		}
		return err
	}
}

func (s *Supervisor) awaitPoke(ctx context.Context, poked chan struct{}, giveBack <-chan time.Time, last *[2]time.Time) error {
	select {
	case <-poked:
		// Anyone may announce an exit: a flood of them steps a hold at
		// most twice a second. Twice: a poke from before the task held its
		// lock must not delay the step of its end, soon after.
		if wait := time.Second - time.Since(last[0]); wait > 0 {
			select {
			case <-time.After(wait):
			case <-s.draining:
				return river.JobSnooze(0)
			case <-ctx.Done():
				return river.JobSnooze(0)
			}
		}
		last[0], last[1] = last[1], time.Now()
		return nil
	case <-giveBack:
	case <-s.draining:
	case <-ctx.Done():
	}
	return river.JobSnooze(0)
}

// takenOver reports whether job was fetched again since this Work began
// (rescued while this supervisor was cut off or too slow), so that another
// Work holds it now, over whose job River would write whatever this Work
// returned. A database that does not answer within 5 s says no.
func (s *Supervisor) takenOver(ctx context.Context, job *river.Job[TaskArgs]) bool {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	js, err := etlcontext.JobRun(lctx, s.pool, job.ID)
	return err == nil && fetchedAgain(job, js)
}

// fetchedAgain reports whether js, job's state, says it runs under another
// fetch than this Work's.
func fetchedAgain(job *river.Job[TaskArgs], js etlcontext.JobState) bool {
	return js.Running && job.AttemptedAt != nil && !js.AttemptedAt.Equal(*job.AttemptedAt)
}

// outlive waits, writing nothing, until the Work that took job over is done
// with it, so that what this one then returns changes nothing.
func (s *Supervisor) outlive(ctx context.Context, job *river.Job[TaskArgs]) error {
	s.logger.Warn("another supervisor took this task over; waiting until it is done with it", "etl_context_id", job.Args.ETLContextID, "job_id", job.ID)
	tick := time.NewTicker(time.Duration(s.cfg.PollInterval))
	defer tick.Stop()
	for range tick.C {
		js, err := etlcontext.JobRun(context.WithoutCancel(ctx), s.pool, job.ID)
		if err == nil && !js.Running {
			break
		}
	}
	return river.JobSnooze(0)
}

// stepInSlot is a step taken in one of the queue's step slots
// (Options.MaxWorkers); a hold takes none while it waits. The step of a job
// whose task held its lock at its last step takes one of as many slots of
// their own, so as not to queue behind a burst's starts.
func (s *Supervisor) stepInSlot(ctx context.Context, job *river.Job[TaskArgs], holding bool) error {
	slots := s.stepSlots[job.Queue]
	if holding {
		slots = s.holdSlots[job.Queue]
	}
	if !s.take(ctx, slots) {
		// Stopping: the next supervisor steps it.
		return river.JobSnooze(0)
	}
	defer func() { <-slots }()
	return s.step(ctx, job, holding)
}

// take takes a token of slots, and reports false when none was free before
// the supervisor stopped or ctx ended. A free one is taken even while
// stopping, by a step that must settle what its Work launched: select
// would pick at random between it and draining.
func (s *Supervisor) take(ctx context.Context, slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	select {
	case slots <- struct{}{}:
		return true
	case <-s.draining:
	case <-ctx.Done():
	}
	return false
}

// begin records that a Work of this supervisor received job's fetch, and
// reports false if a rescue gave the fetch back as lost (giveBack).
func (s *Supervisor) begin(job *river.Job[TaskArgs]) bool {
	if job.AttemptedAt == nil || len(job.AttemptedBy) == 0 {
		// River records both at every fetch.
		return true
	}
	f := fetchOf(job.ID, job.AttemptedBy[len(job.AttemptedBy)-1], *job.AttemptedAt)
	s.mu.Lock()
	defer s.mu.Unlock()
	if began, ok := s.begun[f]; ok && began.IsZero() {
		return false
	}
	s.begun[f] = time.Now()
	return true
}

// holding registers a Work of context id and returns the channel that
// pokes it; released unregisters it. A context may have two Works here at
// once: that of a job it left (dama retry while a dead supervisor held it,
// rescued since) beside its own, whose pokes the other's end must not
// unregister.
func (s *Supervisor) holding(id int64) chan struct{} {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.holds[id] = append(s.holds[id], ch)
	s.mu.Unlock()
	return ch
}

func (s *Supervisor) released(id int64, ch chan struct{}) {
	s.mu.Lock()
	if held := slices.DeleteFunc(s.holds[id], func(c chan struct{}) bool { return c == ch }); len(held) > 0 {
		s.holds[id] = held
	} else {
		delete(s.holds, id)
	}
	s.mu.Unlock()
}

// poke tells the Works of context id here, if any, to look at the task
// again (a hint: a step decides from the database), and reports whether
// there were any.
func (s *Supervisor) poke(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.holds[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return len(s.holds[id]) > 0
}
