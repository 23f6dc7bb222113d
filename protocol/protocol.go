// Package protocol is the contract between the processes of a task, which
// may be of different releases: the supervisor that launches a task
// process (`dama taskrunner`), the task process that holds the task's
// lock, and the command or function it runs. Everything either side relies
// on of the other is defined here, once: the task process's command line
// (Launch) and the descriptors it is handed, its exit codes, every DAMA_*
// variable, the NOTIFY channels, the lock modes, the log file's path, and
// the events pipe's lines and event types.
//
// It imports nothing of dama's, so that a command's own program may use it
// (the task package does) without the supervisor's dependencies.
package protocol

import (
	"path/filepath"
	"strconv"
	"strings"
)

// Version is the version of what a task process and the rest of dama rely
// on of each other, across releases: everything in this package, the lock
// keys, and the columns and events a task process writes under the
// database's checks. A release raises it when it changes any of these so
// that a task process of an older release could no longer work with it;
// the database records the oldest version it accepts
// (data_manager.compatibility), which a migration raises only once no task
// process of an older one runs.
const Version = 1

// Exit codes of a task process.
const (
	// ExitDone: the command exited 0 and the context is DONE.
	ExitDone = 0
	// ExitSetup: the task process could not run (bad arguments,
	// unreachable database); it wrote nothing.
	ExitSetup = 1
	// ExitLocked: another process holds the context's lock, or this run is
	// not the context's current launch; the task process wrote nothing.
	ExitLocked = 100
	// ExitFinished: the context is already finished; nothing was written.
	ExitFinished = 101
	// ExitFailed: the command failed (non-zero exit, or it could not be
	// started); an ERROR event records why.
	ExitFailed = 102
	// ExitCancelled: the task was cancelled; a CANCELLED event records it.
	ExitCancelled = 103
	// ExitLockLost: the lock was lost and not taken again within
	// reconnect_grace (or the run was superseded), so the command was
	// stopped.
	ExitLockLost = 104
	// ExitUnfit: this host cannot run the task (its log directory is
	// unwritable, the kind's command or configuration is missing here); a
	// WARNING event records why, and the supervisor takes the launch back
	// without spending an attempt.
	ExitUnfit = 105
	// ExitRefused: the database no longer accepts task processes of this
	// Version (it was migrated by a release that retired it); the task
	// process wrote nothing and took no lock. The supervisor that launched
	// it is as old: it stops, and leaves the task to a newer one.
	ExitRefused = 106
)

// The environment of a task process, set by the supervisor that launches
// it.
const (
	// DatabaseURLEnv and ConfigEnv name the database and the configuration
	// file the task process reads.
	DatabaseURLEnv = "DATABASE_URL"
	ConfigEnv      = "DAMA_CONFIG"
	// ProcessEnv says which task process a program was started as:
	// ProcessRunner (by a supervisor, with Launch's arguments) or
	// ProcessFunction (by a task process, to call FunctionEnv's function).
	// A program embedding the supervisor reads it in
	// supervisor.RunTaskProcess; the dama binary is told by its arguments.
	ProcessEnv      = "DAMA_TASK_PROCESS"
	ProcessRunner   = "runner"
	ProcessFunction = "function"
	// ProcessKeeper: started by a task process as its host's lock keeper,
	// with KeeperLaunch's arguments.
	ProcessKeeper = "keeper"
	// FunctionEnv names the function a function process calls.
	FunctionEnv = "DAMA_FUNCTION"
)

// DatabaseVar reports whether the environment variable name says how to
// connect to the database: the URL, or one of libpq's PG* variables
// (PGPASSWORD among them). A task process gets them among its Secrets,
// and a command only those its kind passes.
func DatabaseVar(name string) bool {
	return name == DatabaseURLEnv || strings.HasPrefix(name, "PG")
}

// The environment a command (or a function process) gets from its task
// process, beside the supervisor's own less dama's credentials.
const (
	// ContextIDEnv is the task's etl_context_id.
	ContextIDEnv = "DAMA_ETL_CONTEXT_ID"
	// KindEnv is the task's kind.
	KindEnv = "DAMA_KIND"
	// AttemptEnv is the attempt number, from 1.
	AttemptEnv = "DAMA_ATTEMPT"
	// ArgsEnv is the task's arguments, its INITIAL payload, as JSON.
	ArgsEnv = "DAMA_ARGS"
	// CheckpointEnv is the payload of the task's latest CHECKPOINT event,
	// empty when there is none.
	CheckpointEnv = "DAMA_CHECKPOINT"
	// EventsFDEnv is the descriptor of the events pipe, EventsFD.
	EventsFDEnv = "DAMA_EVENTS_FD"
	// RunIDEnv is the attempt's run id, inherited by every process the
	// command starts: a supervisor on the same host finds the attempt's
	// processes by it.
	RunIDEnv = "DAMA_RUN_ID"
)

// SessionName is the application_name of the libpq sessions of run
// runID's command, which its task process sets in PGAPPNAME (unless the
// kind turns it off, config.Kind.SessionFence): a supervisor starts no
// attempt of the task while a session of the previous run is left on its
// server (pg_stat_activity). At most 45 bytes, within PostgreSQL's 63.
func SessionName(runID string) string { return "dama-run:" + runID }

// SessionCheckOption is what a command's PGOPTIONS gets after its own:
// its server looks every second whether the client of a running statement
// is gone, and ends the statement if so (PostgreSQL 14 and later), rather
// than only when it next reads from or writes to it.
const SessionCheckOption = "-c client_connection_check_interval=1000"

// EventsFD is the descriptor a command writes its events on (EventsFDEnv
// names it).
const EventsFD = 3

// The NOTIFY channels of the task processes. (The database announces on
// its own: etlcontext.FinishedChannel and etlcontext.ControlChannel.)
const (
	// CancelChannel: `dama cancel` announces the id of a context to cancel,
	// which its task process stops.
	CancelChannel = "dama_cancel"
	// ExitedChannel: a task process announces, after it released its lock,
	// the id of the context it ran, so that supervisors settle the
	// context's job at once.
	ExitedChannel = "dama_task_exited"
)

// LogPath is the file a task's command writes its output to, appended to
// by every attempt: <log_dir>/<etl_context_id>.log.
func LogPath(logDir string, id int64) string {
	return filepath.Join(logDir, LogName(id))
}

// MaxLogChunk bounds one write of a task's log tail to the database
// (data_manager.append_log refuses more): each takes well within
// the statement timeout, and the runner holds one chunk's memory, whatever
// log_tail_bytes is.
const MaxLogChunk = 256 << 10

// LogName is the base name of LogPath.
func LogName(id int64) string { return strconv.FormatInt(id, 10) + ".log" }

// LockMode says how a task process holds the lock that proves it runs.
type LockMode string

const (
	// LockModeRow, the default, is the seed design: the context's INITIAL
	// event row is locked FOR UPDATE in a transaction held open for the
	// task's whole life, on a connection of its own; writes go over a
	// second connection. Two server connections per task, and the open
	// transaction keeps VACUUM from removing any row version that died
	// after the task started, in every table of the cluster.
	LockModeRow LockMode = "row"
	// LockModeAdvisory holds a session-level advisory lock keyed by the
	// context id, with no transaction left open: the lock, the writes and
	// the cancellation LISTEN share one connection, and VACUUM is left
	// alone. The guarantees are the same as row mode's.
	LockModeAdvisory LockMode = "advisory"
	// LockModeHost holds the same session-level advisory lock, on the
	// session of the host's lock keeper: one process per host and
	// database, started by the first task process that needs it, which
	// holds the locks of all of them on one connection and runs their
	// writes on a small pool of its own. The server connections no longer
	// grow with the number of tasks. The guarantees are the other modes':
	// the keeper's loss is ridden out like the database's.
	LockModeHost LockMode = "host"
)

// Valid reports whether m is a lock mode.
func (m LockMode) Valid() bool {
	return m == LockModeRow || m == LockModeAdvisory || m == LockModeHost
}

// ConnectionsPerTask is how many server connections a running task process
// of this mode holds: none of its own in host mode.
func (m LockMode) ConnectionsPerTask() int {
	switch m {
	case LockModeAdvisory:
		return 1
	case LockModeHost:
		return 0
	}
	return 2
}
