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
// it gives the job back (a snooze of zero: available at once, its attempt
// given back) to be fetched again, by this supervisor or another. It is
// under an hour, River's default RescueStuckJobsAfter, so that no River
// client's rescuer (another release's, or one left at River's defaults)
// takes a held job for a stuck one. A held job costs nothing while it
// waits: one step per task per holdFor.
const holdFor = 30 * time.Minute

// workTimeout is River's timeout of a Work: a hold and the steps around it.
func workTimeout(launch time.Duration) time.Duration { return holdFor + 3*stepTimeout(launch) }

// Sentinels a step returns to its Work (never to River).
var (
	// errHold: the task's process holds its lock; hold the job until the
	// task ends.
	errHold = errors.New("task running: hold its job")
	// errStepAgain: the launch ended without a running task; what the
	// runner recorded, or failed to, decides, so step again at once.
	errStepAgain = errors.New("step again")
	// errTakenOver: another Work fetched the job since this one began;
	// write nothing over its job (outlive).
	errTakenOver = errors.New("job taken over by another Work")
)

// taskWorker is River's view of a task: one Work steps it and, while it
// runs, holds its job (see work).
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
	k, ok := w.s.cfg.Kind(job.Args.TaskKind)
	if !ok {
		return time.Time{}
	}
	d := k.RetryDelay(job.Attempt)
	if d == 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}

func (w *taskWorker) Timeout(*river.Job[TaskArgs]) time.Duration {
	return workTimeout(w.s.opts.LaunchTimeout)
}

// work steps the task of job and, while its task process holds the lock,
// holds the job: River shows it running for as long as the task runs, and
// it completes, fails or is cancelled the moment the task ends, in the
// step that sees it end. The hold waits on no connection: the task's end
// pokes it (the supervisor reaping its runner, a runner's NOTIFY, the
// watch finding the lock free each poll interval). A stopping supervisor,
// or one holding for holdFor, gives the job back.
func (s *Supervisor) work(ctx context.Context, job *river.Job[TaskArgs]) error {
	if !s.begin(job) {
		// Given back as a lost fetch's, a moment ago: another Work may
		// hold the job now.
		return s.outlive(ctx, job)
	}
	if s.retired.Load() {
		// Stopping because the database refused this release's task
		// processes: leave the task to a newer supervisor.
		return river.JobSnooze(time.Duration(s.cfg.PollInterval))
	}
	id := job.Args.ETLContextID
	poked := s.holding(id)
	defer s.released(id, poked)
	giveBack := time.NewTimer(holdFor)
	defer giveBack.Stop()
	// held: this Work has held its task; holding: its last step found the
	// task holding its lock.
	again, held, holding := 0, false, false
	// The times of the last two steps a poke caused, the older first.
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
		return s.unlessTakenOver(ctx, job, err)
	}
}

// unlessTakenOver returns err, what the Work returns; but a snooze (a
// hold given back, a step that failed or was cut short by the stop) of a
// job another Work has taken over returns only once that one is done with
// the job (outlive). A step that locked its task looked already, in the
// same read (errTakenOver).
func (s *Supervisor) unlessTakenOver(ctx context.Context, job *river.Job[TaskArgs], err error) error {
	var snooze *rivertype.JobSnoozeError
	if errors.As(err, &snooze) && s.takenOver(ctx, job) {
		return s.outlive(ctx, job)
	}
	return err
}

func (s *Supervisor) awaitPoke(ctx context.Context, poked chan struct{}, giveBack <-chan time.Time, last *[2]time.Time) error {
	select {
	case <-poked:
		// Anyone may announce an exit: a flood of them steps a hold at
		// most twice a second. Twice: a poke from before the task held its
		// lock (the watch saw it free after its start was recorded) steps a
		// hold that its task's end, soon after, steps again at once.
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

// takenOver reports whether job, worked by this Work, was fetched again
// since this Work began: it was rescued while this supervisor was cut off
// from the database or too slow to step it, and another Work holds it
// now. Whatever this Work returned, River would write over that one's job
// (its completion checks the job's state alone). A database that does not
// answer within takeoverLook says no.
func (s *Supervisor) takenOver(ctx context.Context, job *river.Job[TaskArgs]) bool {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), takeoverLook)
	defer cancel()
	js, err := etlcontext.JobRun(lctx, s.pool, job.ID)
	return err == nil && fetchedAgain(job, js)
}

// takeoverLook bounds takenOver's read.
const takeoverLook = 5 * time.Second

// fetchedAgain reports whether js, job's state, says it runs under a fetch
// later than the one this Work has.
func fetchedAgain(job *river.Job[TaskArgs], js etlcontext.JobState) bool {
	return js.Running && job.AttemptedAt != nil && !js.AttemptedAt.Equal(*job.AttemptedAt)
}

// outlive waits, writing nothing, until the Work that took job over is done
// with it, so that what this one then returns finds the job no longer
// running and changes nothing; it looks once per poll interval.
func (s *Supervisor) outlive(ctx context.Context, job *river.Job[TaskArgs]) error {
	s.logger.Warn("another supervisor took over this task's job; waiting for it to be done with the job", "etl_context_id", job.Args.ETLContextID, "job_id", job.ID)
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
// (Options.MaxWorkers), which bound the steps under way at once however
// many jobs River hands out: a hold takes none while it waits. The step of
// a job whose task held its lock at its last step takes one of as many
// slots of their own: the step that completes the job of a task that
// ended does not queue behind a burst's starts.
func (s *Supervisor) stepInSlot(ctx context.Context, job *river.Job[TaskArgs], holding bool) error {
	slots := s.stepSlots[job.Queue]
	if holding {
		slots = s.holdSlots[job.Queue]
	}
	if !s.take(ctx, slots) {
		// Stopping: wait for no slot to launch; the next supervisor steps
		// it.
		return river.JobSnooze(0)
	}
	defer func() { <-slots }()
	return s.step(ctx, job, holding)
}

// take takes a token of slots, and reports false when none was free before
// the supervisor stopped or ctx ended. A free one is taken even while
// stopping, by a step that must settle what its Work launched (a launch
// refused, taken back): select would pick at random between it and
// draining.
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

// poke tells the Works of context id that this supervisor runs, if any, to
// look at the task again (a hint, for a step decides from the database),
// and reports whether there were any.
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
