package supervisor

import (
	"time"

	"github.com/dama-etl/dama/etlcontext"
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

// fetchCooldown is the River client's FetchCooldown. River sends at most
// one insert notification per queue per FetchCooldown from a client; its
// default (100ms) would leave tasks submitted in a burst waiting for the
// supervisors' next fetch poll.
const fetchCooldown = 10 * time.Millisecond
