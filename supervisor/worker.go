package supervisor

import (
	"context"
	"time"

	"github.com/riverqueue/river"
)

// stepTimeout bounds a step: its launch wait plus a margin for its queries.
func stepTimeout(launch time.Duration) time.Duration { return launch + 20*time.Second }

// taskWorker is River's view of the step.
type taskWorker struct {
	river.WorkerDefaults[TaskArgs]
	s *Supervisor
}

func (w *taskWorker) Work(ctx context.Context, job *river.Job[TaskArgs]) error {
	return w.s.step(ctx, job, 0)
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
	return stepTimeout(w.s.opts.LaunchTimeout)
}
