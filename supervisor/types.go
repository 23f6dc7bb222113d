package supervisor

import "github.com/dama-etl/dama/etlcontext"

// What a Client returns, named here: the machinery that reads and writes
// dama's tables is internal (etlcontext), and a program reads a
// task's status from these, or with SQL from data_manager.dama_task_queue.
type (
	// Context is a task as data_manager.etl_contexts holds it.
	Context = etlcontext.Context
	// Status is a task's status, etl_status.
	Status = etlcontext.Status
	// KindBlock is a kind's block (BlockKind).
	KindBlock = etlcontext.KindBlock
	// QueuePause is a queue's pause (PauseQueue).
	QueuePause = etlcontext.QueuePause
	// QueueStat is a row of data_manager.dama_queue_stats (QueueStats).
	QueueStat = etlcontext.QueueStat
	// Schedule is a row of data_manager.dama_schedules (Schedules).
	Schedule = etlcontext.Schedule
	// DB is what NewStatsCollector reads with: a pool, a connection or
	// a transaction.
	DB = etlcontext.DB
)

// A task's statuses.
const (
	StatusQueued    = etlcontext.StatusQueued
	StatusRunning   = etlcontext.StatusRunning
	StatusRetrying  = etlcontext.StatusRetrying
	StatusDone      = etlcontext.StatusDone
	StatusFailed    = etlcontext.StatusFailed
	StatusCancelled = etlcontext.StatusCancelled
)

// ErrNotFound is what a Client's calls wrap for a task that does not
// exist.
var ErrNotFound = etlcontext.ErrNotFound
