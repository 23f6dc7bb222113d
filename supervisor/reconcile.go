package supervisor

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
)

// reconcile repairs the disagreements a step cannot see, because no step
// runs once a job is finished: a context that is not finished while its
// River job is, or a finished context whose job ended in a state that says
// otherwise (River's own rescuer, or a job cancelled or deleted by hand).
// The job is retried, or a new one enqueued.
func (s *Supervisor) reconcile(ctx context.Context) error {
	found, err := etlcontext.Disagreements(ctx, s.pool, s.cfg.QueueNames())
	if err != nil {
		return err
	}
	for _, d := range found {
		if d.Job != nil {
			if _, err := s.river.JobRetry(ctx, *d.Job); err != nil {
				return fmt.Errorf("retry job %d of unsettled task %d: %w", *d.Job, d.ID, err)
			}
			s.logger.Warn("a task's River job disagreed with the task (ended by River's rescuer, or by hand): the job is tried again to set them right", "etl_context_id", d.ID, "job_id", *d.Job)
		} else {
			// Retrying a job twice is harmless, inserting two is not: a
			// context must have exactly one job.
			jobID, err := s.enqueueMissingJob(ctx, d)
			if err != nil {
				return fmt.Errorf("enqueue a job for unsettled task %d: %w", d.ID, err)
			}
			if jobID == 0 {
				// Another supervisor's reconcile enqueued one first.
				continue
			}
			s.logger.Warn("a task's River job was gone (deleted by hand?): the task has a new one", "etl_context_id", d.ID, "job_id", jobID)
		}
		s.notifyQueue(ctx, d.Queue)
	}
	return nil
}

// enqueueMissingJob inserts a River job for context d, whose job was gone,
// and returns its id; or 0 when another supervisor's reconcile gave it one
// meanwhile (etlcontext.LockJobless).
func (s *Supervisor) enqueueMissingJob(ctx context.Context, d etlcontext.Disagreement) (int64, error) {
	var inserted int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		jobless, err := etlcontext.LockJobless(ctx, tx, d.ID)
		if err != nil || !jobless {
			return err
		}
		inserted, err = etlcontext.EnqueueJob(ctx, tx, d.ID)
		return err
	})
	return inserted, err
}
