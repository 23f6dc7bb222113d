package etlcontext

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
	"github.com/jackc/pgx/v5"
)

// Task is a row of the data_manager.dama_task_queue view: a context with its
// River job, its latest event and progress, and whether a live process holds
// its lock.
type Task struct {
	ID          int64  `json:"etl_context_id"`
	ParentID    *int64 `json:"parent_context_id"`
	Kind        string `json:"kind"`
	Queue       string `json:"queue"`
	Status      Status `json:"etl_status"`
	Attempt     int    `json:"attempt"`
	MaxAttempts int    `json:"max_attempts"`
	// JobState is River's state of the task's job once it is finalized;
	// before, what the job does for the task, in River's words, agreeing
	// with Status ("finalizing" for a finished task's job not yet
	// finalized). Nil for a task without a job.
	JobState        *string         `json:"job_state"`
	Host            *string         `json:"host"`
	PID             *int            `json:"pid"`
	CreatedAt       time.Time       `json:"created_at"`
	StartedAt       *time.Time      `json:"started_at"`
	FinishedAt      *time.Time      `json:"finished_at"`
	HeartbeatAt     *time.Time      `json:"heartbeat_at"`
	LatestEventType *string         `json:"latest_event_type"`
	LatestEventAt   *time.Time      `json:"latest_event_at"`
	Progress        json.RawMessage `json:"progress"`
	// ProgressAt is when the task last reported Progress.
	ProgressAt         *time.Time `json:"progress_at"`
	InitialEventLocked bool       `json:"initial_event_locked"`
	RiverJobID         *int64     `json:"river_job_id"`
	RunID              *string    `json:"run_id"`
	IdempotencyKey     *string    `json:"idempotency_key"`
	CancelRequestedAt  *time.Time `json:"cancel_requested_at"`
	LogPath            *string    `json:"log_path"`
	HostID             *string    `json:"host_id"`
	CommandPGID        *int       `json:"command_pgid"`
	LockLostAt         *time.Time `json:"lock_lost_at"`
	// LockMode, RunnerRelease and RunnerProtocol describe the current
	// attempt's task process; nil for one of an unreleased build.
	LockMode       *string `json:"lock_mode"`
	RunnerRelease  *string `json:"runner_release"`
	RunnerProtocol *int    `json:"runner_protocol"`
	// DueAt is when the task may next start (a retry's backoff included);
	// WaitingFor and WaitingSince say why, and since when, a due task has
	// not started (nil when it is not waiting for a slot).
	DueAt          *time.Time `json:"due_at"`
	WaitingFor     *string    `json:"waiting_for"`
	WaitingSince   *time.Time `json:"waiting_since"`
	ConcurrencyKey *string    `json:"concurrency_key"`
	// Children counts the task's children by status; nil when it has none.
	Children Children `json:"children"`
	// Stalled, set while a running task is marked stalled, is its
	// STALLED event's payload: stall_after, last_at, on_stall.
	Stalled json.RawMessage `json:"stalled,omitempty"`
}

// TaskQuery selects rows of the view.
type TaskQuery struct {
	// ID, when non-zero, selects that context alone.
	ID int64
	// Statuses, when not empty, selects contexts in those statuses.
	Statuses []Status
	// Limit, when positive, keeps the newest Limit rows.
	Limit int
	// ParentID, when non-zero, selects the children of that context.
	ParentID int64
	// Kind, Queue and IdempotencyKey, when not empty, select the contexts
	// of that kind, of that queue and submitted with that key.
	Kind           string
	Queue          string
	IdempotencyKey string
	// Before, when non-zero, selects the contexts older than that one
	// (ids below it): the next page of a list.
	Before int64
	// MaxPayload, when positive, reads each task's progress up to that
	// many bytes (see TruncatedKey).
	MaxPayload int
	// ActiveFirst, without Statuses, lists the running tasks first, then
	// the retrying, then the queued, then the finished, each newest first:
	// a page of short tasks never hides a running one. Before then pages
	// on from task Before, of status BeforeStatus; as tasks move between
	// places meanwhile, a page after the first may miss one or show it
	// again, as a list that moves does.
	ActiveFirst  bool
	BeforeStatus Status
}

// conditions writes q's conditions, each parameter by param: only those
// asked for, rather than one statement whose conditions switch off by their
// arguments, for PostgreSQL may run a cached statement with a plan made
// without its arguments, and such a plan of "($1 = 0 OR etl_context_id =
// $1)" reads every context. One status is "=", not "= ANY": then the
// (etl_status, etl_context_id) index returns the newest of that status
// first.
func (q TaskQuery) conditions(param func(any) string) []string {
	var where []string
	add := func(set bool, cond string, v any) {
		if set {
			where = append(where, cond+param(v))
		}
	}
	add(q.ID != 0, "etl_context_id = ", q.ID)
	add(q.ParentID != 0, "parent_context_id = ", q.ParentID)
	add(q.Kind != "", "kind = ", q.Kind)
	add(q.Queue != "", "queue = ", q.Queue)
	add(q.IdempotencyKey != "", "idempotency_key = ", q.IdempotencyKey)
	add(q.Before != 0 && !q.activeFirst(), "etl_context_id < ", q.Before)
	switch len(q.Statuses) {
	case 0:
	case 1:
		where = append(where, "etl_status = "+param(string(q.Statuses[0])))
	default:
		statuses := make([]string, len(q.Statuses))
		for i, st := range q.Statuses {
			statuses[i] = string(st)
		}
		where = append(where, "etl_status = ANY("+param(statuses)+"::text[])")
	}
	return where
}

func (q TaskQuery) activeFirst() bool { return q.ActiveFirst && q.ID == 0 && len(q.Statuses) == 0 }

// params returns a function that adds a parameter to args and names it.
func params(args *[]any) func(any) string {
	return func(v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	}
}

// taskColumns are the columns of a Task, in its fields' order.
const taskColumns = `etl_context_id, parent_context_id, kind, queue, etl_status, attempt, max_attempts,
		       job_state, host, pid, created_at, started_at, finished_at, heartbeat_at,
		       latest_event_type, latest_event_at, progress, progress_at,
		       initial_event_locked, river_job_id, run_id, idempotency_key, cancel_requested_at, log_path,
		       host_id, command_pgid, lock_lost_at, lock_mode, runner_release, runner_protocol,
		       due_at, waiting_for, waiting_since, concurrency_key, children, stalled`

// Tasks reads the view, newest context first (or as q.ActiveFirst says).
func Tasks(ctx context.Context, db DB, q TaskQuery) ([]Task, error) {
	var args []any
	param := params(&args)
	where := q.conditions(param)
	columns := strings.NewReplacer("progress,", boundedJSON("progress", param(q.MaxPayload)+"::int")+" AS progress,",
		"run_id,", "run_id::text AS run_id,").Replace(taskColumns)
	var sql string
	if q.activeFirst() {
		sql = activeFirst(q, columns, where, param)
	} else {
		sql = "SELECT " + columns + "\n\t\t  FROM data_manager.dama_task_queue"
		if len(where) > 0 {
			sql += "\n\t\t WHERE " + strings.Join(where, " AND ")
		}
		sql += "\n\t\t ORDER BY etl_context_id DESC"
		if q.Limit > 0 {
			sql += "\n\t\t LIMIT " + param(q.Limit)
		}
	}
	tasks, err := collect[Task](ctx, db, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("read task queue: %w", err)
	}
	return tasks, nil
}

// activeFirst is the statement of q.ActiveFirst: the ids of each place in
// its order (the finished share the last), each read newest first from its
// status's index and cut to the limit, merged and cut again; then their
// rows of the view, whose columns, a lateral subquery's, are columns.
func activeFirst(q TaskQuery, columns string, where []string, param func(any) string) string {
	places := [][]Status{{StatusRunning}, {StatusRetrying}, {StatusQueued}, {StatusDone, StatusFailed, StatusCancelled}}
	from := 0
	if q.Before != 0 {
		from = max(0, slices.IndexFunc(places, func(p []Status) bool { return slices.Contains(p, q.BeforeStatus) }))
	}
	limit := ""
	if q.Limit > 0 {
		limit = " LIMIT " + param(q.Limit)
	}
	before := ""
	if q.Before != 0 {
		before = "etl_context_id < " + param(q.Before)
	}
	var parts []string
	for place, statuses := range places[from:] {
		place += from
		for _, st := range statuses {
			cond := append(slices.Clone(where), "etl_status = '"+string(st)+"'")
			if place == from && before != "" {
				cond = append(cond, before)
			}
			// Ordered as the (etl_status, etl_context_id) index is, which
			// the planner then reads backwards, rather than the primary key
			// filtered, which reads every newer task of other statuses.
			parts = append(parts, fmt.Sprintf(`(SELECT etl_context_id, %d AS place FROM data_manager.etl_contexts
		          WHERE %s ORDER BY etl_status DESC, etl_context_id DESC%s)`, place, strings.Join(cond, " AND "), limit))
		}
	}
	return `
		SELECT v.* FROM (SELECT * FROM (` + strings.Join(parts, "\n\t\t UNION ALL ") + `) AS u
		 ORDER BY place, etl_context_id DESC` + limit + `) AS p
		 CROSS JOIN LATERAL (SELECT ` + columns + `
		                       FROM data_manager.dama_task_queue WHERE etl_context_id = p.etl_context_id) AS v
		 ORDER BY p.place, p.etl_context_id DESC`
}

// Children counts the children of context parent by status.
type Children map[Status]int

// Pending is how many children are not finished.
func (c Children) Pending() int {
	return c[StatusQueued] + c[StatusRunning] + c[StatusRetrying]
}

// Failed is how many children finished other than DONE: FAILED or
// CANCELLED.
func (c Children) Failed() int {
	return c[StatusFailed] + c[StatusCancelled]
}

// ChildCounts counts the children of context parent by status.
func ChildCounts(ctx context.Context, db DB, parent int64) (Children, error) {
	counts := Children{}
	err := db.QueryRow(ctx, `
		SELECT coalesce(jsonb_object_agg(etl_status, n), '{}')
		  FROM (SELECT etl_status, count(*) AS n FROM data_manager.etl_contexts
		         WHERE parent_context_id = $1 GROUP BY etl_status) AS s`, parent).Scan(&counts)
	if err != nil {
		return nil, fmt.Errorf("count children of task %d: %w", parent, err)
	}
	return counts, nil
}

// Trouble is what a task last said went wrong.
type Trouble struct {
	// Error is the newest ERROR event's reason, empty when there is none.
	Error string
	// Unfit is why a host could not start the task's next attempt (its
	// launches are taken back without spending one), by its WARNING; Host
	// that host, and At when it first said so (a task process says it once
	// per attempt and reason); empty when none did.
	Unfit, Host string
	At          time.Time
	// Unserved says that no supervisor serves the kind of a task that
	// waits to start in its queue (KindServed: though one serves the kind
	// in another); LastServed, when one that did was last seen, and on
	// which host (nil when none ever did).
	Unserved, KindServed bool
	LastServed           *time.Time
	LastServedHost       string
}

// maxTroubleText bounds each text of a Trouble, in characters: a list of
// 100 tasks whose commands failed with lines of a MiB each would be 100
// MiB, read every second by a page left open.
const maxTroubleText = 1024

// Troubles returns the Trouble of each of the tasks ids that has one, in
// one statement, each text cut to maxTroubleText characters.
func Troubles(ctx context.Context, db DB, ids []int64) (map[int64]Trouble, error) {
	rows, err := db.Query(ctx, `
		WITH sup AS MATERIALIZED (SELECT state, host, kinds, queues, last_seen_at FROM data_manager.dama_supervisors)
		SELECT c.etl_context_id, f.reason, f.code, f.exit,
		       left(u.meta->>$4, $5), left(u.payload->>'host', $5), u.created_at,
		       w.etl_context_id IS NOT NULL, coalesce(w.kind_served, false), w.last_seen_at, w.host
		  FROM data_manager.etl_contexts AS c
		  LEFT JOIN LATERAL (
		       SELECT left(e.payload->>'reason', $5) AS reason, left(e.payload->>'exit_code', 12) AS code,
		              left(e.payload->>'exit', $5) AS exit
		         FROM data_manager.event_store AS e
		        WHERE e.etl_context_id = c.etl_context_id AND e.type = c.kind || ':' || $2
		        ORDER BY e.event_id DESC LIMIT 1) AS f ON true
		  LEFT JOIN LATERAL (
		       SELECT e.meta, e.payload, e.created_at FROM data_manager.event_store AS e
		        WHERE c.etl_status IN `+sqlDue+`
		          AND e.etl_context_id = c.etl_context_id AND e.type = c.kind || ':' || $3
		          AND e.attempt = c.attempt + 1 AND e.meta ? $4
		        ORDER BY e.event_id DESC LIMIT 1) AS u ON true
		  LEFT JOIN LATERAL (
		       SELECT c.etl_context_id, s.last_seen_at, s.host,
		              EXISTS (SELECT FROM sup WHERE sup.state = '`+SupervisorServing+`' AND c.kind = ANY (sup.kinds)) AS kind_served
		         FROM (SELECT) AS one
		         LEFT JOIN LATERAL (SELECT sup.last_seen_at, sup.host FROM sup WHERE c.kind = ANY (sup.kinds)
		                             ORDER BY sup.last_seen_at DESC LIMIT 1) AS s ON true
		        WHERE c.etl_status IN `+sqlDue+`
		          -- One of a release that does not say what it serves may
		          -- serve anything (kinds NULL).
		          AND NOT EXISTS (SELECT FROM sup WHERE sup.state = '`+SupervisorServing+`'
		                             AND (sup.kinds IS NULL OR c.kind = ANY (sup.kinds) AND c.queue = ANY (sup.queues)))) AS w ON true
		 WHERE c.etl_context_id = ANY($1) AND c.etl_status IN (`+sqlQueued+`, `+sqlRetrying+`, `+sqlFailed+`)`, ids, protocol.EventError, protocol.EventWarning, UnfitHostMeta, maxTroubleText)
	if err != nil {
		return nil, fmt.Errorf("read what went wrong with tasks: %w", err)
	}
	troubles := map[int64]Trouble{}
	var (
		id                                       int64
		errText, code, exit, unfit, on, lastHost *string
		at, lastSeen                             *time.Time
		unserved, kindServed                     bool
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &errText, &code, &exit, &unfit, &on, &at, &unserved, &kindServed, &lastSeen, &lastHost}, func() error {
		var t Trouble
		if errText != nil {
			t.Error = failedWith(*errText, deref(code), deref(exit))
		}
		if unfit != nil && at != nil {
			t.Unfit, t.At = strings.TrimPrefix(*unfit, UnfitPrefix), *at
			if on != nil {
				t.Host = *on
			}
		}
		if unserved {
			t.Unserved, t.KindServed, t.LastServed = true, kindServed, lastSeen
			if lastHost != nil {
				t.LastServedHost = *lastHost
			}
		}
		if t != (Trouble{}) {
			troubles[id] = t
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read what went wrong with tasks: %w", err)
	}
	return troubles, nil
}

// failedWith is what went wrong, by an outcome's reason, exit_code and
// exit: led by how the command ended ("exit 3", "killed by SIGSEGV") when
// the reason is its own words (its failure line, else its last line).
func failedWith(reason, code, exit string) string {
	switch {
	case exit == "":
		return reason
	case code != "" && !strings.HasPrefix(code, "-"):
		return "exit " + code + ": " + reason
	}
	return strings.TrimPrefix(exit, "command ") + ": " + reason
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// CountByStatus counts the contexts q selects in each status, its
// Statuses, Before and Limit aside, each count up to upTo: one that
// reaches it means "upTo or more", read at the same cost from a database
// of millions of tasks.
func CountByStatus(ctx context.Context, db DB, q TaskQuery, upTo int) (map[Status]int, error) {
	q.Statuses, q.Before, q.Limit = nil, 0, 0
	var args []any
	param := params(&args)
	where := q.conditions(param)
	limit := param(upTo)
	parts := make([]string, len(Statuses))
	for i, st := range Statuses {
		// A literal of dama's own, so that each count reads the index of
		// its status.
		status := "'" + string(st) + "'"
		cond := append(slices.Clone(where), "etl_status = "+status)
		parts[i] = status + ", (SELECT count(*) FROM (SELECT FROM data_manager.etl_contexts WHERE " +
			strings.Join(cond, " AND ") + " LIMIT " + limit + ") AS x)"
	}
	var counts map[Status]int
	if err := db.QueryRow(ctx, "SELECT json_build_object("+strings.Join(parts, ", ")+")", args...).Scan(&counts); err != nil {
		return nil, fmt.Errorf("count tasks by status: %w", err)
	}
	return counts, nil
}

// FinishedSpan is how many contexts finished in a span of time, by status.
type FinishedSpan struct {
	At        time.Time `json:"at"`
	Done      int       `json:"done"`
	Failed    int       `json:"failed"`
	Cancelled int       `json:"cancelled"`
}

// FinishedPer counts the contexts of q's kind and queue that finished since
// since, per unit ("minute" or "hour", from the start of each in UTC, as a
// browser counts them), oldest first, leaving out the spans without any.
func FinishedPer(ctx context.Context, db DB, q TaskQuery, unit string, since time.Time) ([]FinishedSpan, error) {
	if unit != "minute" && unit != "hour" {
		return nil, fmt.Errorf("count finished tasks per %q: per minute or hour", unit)
	}
	args := []any{unit, since}
	where := TaskQuery{Kind: q.Kind, Queue: q.Queue}.conditions(params(&args))
	spans, err := collect[FinishedSpan](ctx, db, `
		SELECT date_trunc($1, finished_at, 'UTC') AS at,
		       count(*) FILTER (WHERE etl_status = `+sqlDone+`),
		       count(*) FILTER (WHERE etl_status = `+sqlFailed+`),
		       count(*) FILTER (WHERE etl_status = `+sqlCancelled+`)
		  FROM data_manager.etl_contexts
		 WHERE `+strings.Join(append([]string{"finished_at >= $2"}, where...), " AND ")+`
		 GROUP BY 1 ORDER BY 1`, args...)
	if err != nil {
		return nil, fmt.Errorf("count finished tasks per %s: %w", unit, err)
	}
	return spans, nil
}
