package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ControlChannel is the NOTIFY channel on which a queue's resumption or a
// kind's unblocking is announced, with a Control as its JSON payload, so
// that supervisors start the tasks that waited at once.
const ControlChannel = "dama_queue_control"

// Control is the payload of a notification on ControlChannel: one of Queue
// and Kind is set.
type Control struct {
	Queue string `json:"queue,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

// Wait says why a due task has not started; WaitNone that it may.
type Wait string

// The reasons a due task waits, as stored in etl_contexts.waiting_for.
const (
	WaitNone        Wait = ""
	WaitQueuePaused Wait = "queue_paused"
	WaitKindBlocked Wait = "kind_blocked"
	WaitQueueFull   Wait = "queue_full"
	WaitKindFull    Wait = "kind_full"
	WaitKeyFull     Wait = "key_full"
	// WaitSessions: a database session of the task's previous run is
	// left on the server (docs/operations.md "Retries and the database").
	WaitSessions Wait = "sessions"
)

// ErrChanged: a start decided from a read of a task found it changed
// since, or its lock held by another.
var ErrChanged = errors.New("task changed since it was read")

// Start is a start of a task decided from Read, a read of it by a step of
// River job Job: its attempt Attempt, launched by LaunchedBy. It must
// respect, from the configuration of the supervisor that starts it,
// QueueMax, a bound on the running tasks of the queue, KindMax, on those of
// the kind in every queue, and KeyMax, on those of the kind with the task's
// concurrency key (when it has one); a kind's or key's 0 means no bound.
type Start struct {
	Read       *Context
	Job        int64
	QueueMax   int
	KindMax    int
	KeyMax     int
	Attempt    int
	LaunchedBy string
}

// StartIfFree starts s's attempt if the task may start now, in one
// statement (data_manager.start_attempt, migration 38), and otherwise
// records, and returns, why it waits. It takes the task's lock, then the
// locks (namespace, hashtext(name)) of the queue, the kind and the key, so
// that no other start, pause or block is decided meanwhile, and counts the
// running tasks once they are held: a start decided under these locks can
// never exceed a bound or start in a paused queue or a blocked kind. The
// locks last for db's transaction, when it is one. It returns ErrChanged,
// and does nothing, if the task is no longer as read (another started it,
// a cancellation was asked) or another holds its lock.
func StartIfFree(ctx context.Context, db DB, s Start) (Run, Wait, error) {
	c := s.Read
	key, hash := newRunKey()
	var (
		wait *string
		run  Run
	)
	err := db.QueryRow(ctx, `
		SELECT waiting, coalesce(new_run::text, ''), coalesce(started_attempt, 0)
		  FROM data_manager.start_attempt($1, $2, $3, $4, $5::uuid, $6, $7, $8, $9, $10, $11)`,
		c.ID, s.Job, string(c.Status), c.Attempt, c.RunID, s.QueueMax, s.KindMax, s.KeyMax,
		s.Attempt, s.LaunchedBy, hash).Scan(&wait, &run.ID, &run.Attempt)
	switch {
	case err != nil:
		return Run{}, WaitNone, fmt.Errorf("start attempt of task %d: %w", c.ID, classify(err))
	case wait == nil:
		run.Key = key
		return run, WaitNone, nil
	case *wait == "changed":
		return Run{}, WaitNone, fmt.Errorf("start attempt of task %d: %w", c.ID, ErrChanged)
	}
	return Run{}, Wait(*wait), nil
}

// MarkWaiting records why the due context id waits to start, unless that is
// recorded already (a task woken to find no slot again writes nothing),
// and reports whether it wrote.
func MarkWaiting(ctx context.Context, db DB, id int64, w Wait) (changed bool, err error) {
	tag, err := db.Exec(ctx, `
		UPDATE data_manager.etl_contexts
		   SET waiting_for = $2, waiting_since = coalesce(waiting_since, now())
		 WHERE etl_context_id = $1 AND waiting_for IS DISTINCT FROM $2
		   AND etl_status IN `+sqlDue, id, string(w))
	if err != nil {
		return false, fmt.Errorf("record why task %d waits: %w", id, err)
	}
	return tag.RowsAffected() > 0, nil
}

// DeriveConcurrencyKey records, and returns, the concurrency key of context
// id under the field of its arguments its kind now names, by
// data_manager.concurrency_key_of; "" when the arguments lack the field
// (counted with the other tasks that lack it).
// Nil, and nothing written, for a task started or given a key since it was
// read.
func DeriveConcurrencyKey(ctx context.Context, db DB, id int64, field string) (*string, error) {
	var key string
	err := db.QueryRow(ctx, `
		UPDATE data_manager.etl_contexts AS c
		   SET concurrency_key = coalesce((SELECT data_manager.concurrency_key_of(e.payload, $2, false)
		                                     FROM data_manager.event_store AS e
		                                    WHERE e.etl_context_id = c.etl_context_id AND e.type LIKE '%:INITIAL'), '')
		 WHERE c.etl_context_id = $1
		   AND c.concurrency_key IS NULL AND c.etl_status IN (`+sqlQueued+`, `+sqlRetrying+`)
		RETURNING c.concurrency_key`, id, field).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		// Started, or given its key, since it was read (a step may read
		// without the task's lock): the key it has stands.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("record concurrency key of task %d: %w", id, err)
	}
	return &key, nil
}

// wakeWaiting is a query, usable as a CTE, of the River job ids of the due
// tasks of queue $1 (max_running $2) that wait for a slot and would find one
// now, at most as many as the queue has free slots, of the configuration's
// kinds only ($3, $4, $5: their names, max_running and max_running_per_key,
// 0 for no bound). A paused queue or a blocked kind wakes nothing. Kinds
// take turns: the tasks are ordered by how many of their kind run, plus
// their rank among their kind's tasks that would find a slot, then by age,
// so that a kind with a thousand tasks waiting never holds back another of
// the same queue; no kind has more tasks woken than it has room for. It
// reads the queue's waiting tasks once (the etl_contexts_waiting index),
// and those of its kinds that hold a slot: data_manager.slot_holders
// (migration 39), which start_attempt counts too, inlined by the planner.
const wakeWaiting = `
	WITH free AS (
		SELECT $2::int - (SELECT count(*) FROM data_manager.slot_holders() AS r WHERE r.queue = $1) AS n
		 WHERE NOT EXISTS (SELECT 1 FROM data_manager.queue_pauses WHERE queue = $1)),
	limits AS (
		SELECT l.*
		  FROM unnest($3::text[], $4::int[], $5::int[]) AS l(kind, max_running, max_per_key)
		 WHERE NOT EXISTS (SELECT 1 FROM data_manager.kind_blocks AS b WHERE b.kind = l.kind)),
	waiting AS (
		SELECT w.etl_context_id, w.river_job_id, w.kind, w.concurrency_key,
		       row_number() OVER (PARTITION BY w.kind, w.concurrency_key ORDER BY w.etl_context_id) - 1 AS key_rank
		  FROM data_manager.etl_contexts AS w
		 WHERE w.queue = $1 AND w.waiting_for IS NOT NULL AND w.waiting_for <> '` + string(WaitSessions) + `'
		   AND w.etl_status IN ` + sqlDue + `
		   AND w.river_job_id IS NOT NULL
		   AND w.kind IN (SELECT kind FROM limits)
		   AND (SELECT n FROM free) > 0),
	kind_running AS (
		SELECT r.kind, count(*) AS n
		  FROM data_manager.slot_holders() AS r
		 WHERE r.kind IN (SELECT kind FROM waiting)
		 GROUP BY r.kind),
	key_running AS (
		SELECT r.kind, r.concurrency_key, count(*) AS n
		  FROM data_manager.slot_holders() AS r
		 WHERE r.concurrency_key IS NOT NULL AND r.kind IN (SELECT kind FROM waiting)
		 GROUP BY r.kind, r.concurrency_key),
	eligible AS (
		SELECT w.river_job_id, w.etl_context_id, w.kind, coalesce(kr.n, 0) AS kind_running, l.max_running,
		       row_number() OVER (PARTITION BY w.kind ORDER BY w.key_rank, w.etl_context_id) - 1 AS kind_rank
		  FROM waiting AS w
		  JOIN limits AS l ON l.kind = w.kind
		  LEFT JOIN kind_running AS kr ON kr.kind = w.kind
		  LEFT JOIN key_running AS yr ON yr.kind = w.kind AND yr.concurrency_key = w.concurrency_key
		 WHERE l.max_per_key <= 0 OR w.concurrency_key IS NULL
		    OR w.key_rank < l.max_per_key - coalesce(yr.n, 0))
	(SELECT river_job_id AS id
	   FROM eligible
	  WHERE max_running <= 0 OR kind_rank < max_running - kind_running
	  ORDER BY kind_running + kind_rank, etl_context_id
	  LIMIT greatest((SELECT n FROM free), 0))
	UNION
	-- Tasks parked by a pause or a block that is lifted, slot or not, once:
	-- their step looks again and records what they wait for now.
	SELECT w.river_job_id
	  FROM data_manager.etl_contexts AS w
	 WHERE w.queue = $1 AND w.waiting_for IN ('` + string(WaitQueuePaused) + `', '` + string(WaitKindBlocked) + `')
	   AND w.etl_status IN ` + sqlDue + ` AND w.river_job_id IS NOT NULL
	   AND w.kind IN (SELECT kind FROM limits)
	   AND NOT EXISTS (SELECT 1 FROM data_manager.queue_pauses WHERE queue = $1)`

// QueuePause is a paused queue.
type QueuePause struct {
	Queue    string    `json:"queue"`
	Reason   string    `json:"reason"`
	PausedBy string    `json:"paused_by"`
	PausedAt time.Time `json:"paused_at"`
}

// KindBlock is a blocked kind.
type KindBlock struct {
	Kind      string    `json:"kind"`
	Reason    string    `json:"reason"`
	BlockedBy string    `json:"blocked_by"`
	BlockedAt time.Time `json:"blocked_at"`
}

// Beginner is what PauseQueue and BlockKind need: a pool, a connection or a
// transaction (in which they run as a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// A hold is a pause of a queue or a block of a kind: a row of table, keyed
// by the queue or the kind, which control_events logs as set and lifted.
// Whoever sets one first takes the lock a start takes (StartIfFree), and so
// waits for the starts being decided.
type hold struct {
	table, key, by, at string
	lock               int
	set, lifted        string
}

var (
	queuePause = hold{"queue_pauses", "queue", "paused_by", "paused_at", queueLockNamespace, "PAUSED", "RESUMED"}
	kindBlock  = hold{"kind_blocks", "kind", "blocked_by", "blocked_at", kindLockNamespace, "BLOCKED", "UNBLOCKED"}
)

// put records the hold of name, for reason, by by, unless one is in force,
// and scans the one in force into dest: its name, reason, by and at.
func (h hold) put(ctx context.Context, db Beginner, name, reason, by string, dest ...any) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, h.lock, name); err != nil {
			return fmt.Errorf("lock %s %s: %w", h.key, name, err)
		}
		return tx.QueryRow(ctx, fmt.Sprintf(`
			WITH ins AS (
				INSERT INTO data_manager.%[1]s (%[2]s, reason, %[3]s) VALUES ($1, $2, $3 || ' (database role ' || session_user || ')')
				ON CONFLICT (%[2]s) DO NOTHING
				RETURNING %[2]s, reason, %[3]s, %[4]s),
			logged AS (
				INSERT INTO data_manager.control_events (action, %[2]s, reason, actor)
				SELECT '%[5]s', %[2]s, reason, %[3]s FROM ins)
			SELECT * FROM ins
			UNION ALL
			SELECT %[2]s, reason, %[3]s, %[4]s FROM data_manager.%[1]s
			 WHERE %[2]s = $1 AND NOT EXISTS (SELECT 1 FROM ins)`, h.table, h.key, h.by, h.at, h.set),
			name, reason, by).Scan(dest...)
	})
}

// lift deletes the hold of name, recording that by did, and announces it on
// ControlChannel; it reports whether there was one.
func (h hold) lift(ctx context.Context, db Beginner, name, by string) (lifted bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, fmt.Sprintf(`
			WITH del AS (
				DELETE FROM data_manager.%[1]s WHERE %[2]s = $1 RETURNING %[2]s),
			logged AS (
				INSERT INTO data_manager.control_events (action, %[2]s, actor)
				SELECT '%[3]s', %[2]s, $2 || ' (database role ' || session_user || ')' FROM del)
			SELECT EXISTS (SELECT 1 FROM del)`, h.table, h.key, h.lifted), name, by).Scan(&lifted)
		if err != nil {
			return err
		}
		c := Control{Queue: name}
		if h.key == kindBlock.key {
			c = Control{Kind: name}
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, json_build_object('queue', $2::text, 'kind', $3::text)::text)`,
			ControlChannel, c.Queue, c.Kind)
		return err
	})
	return lifted, err
}

// PauseQueue pauses queue: once it returns, no task of the queue starts
// until ResumeQueue (a start decided before it is already RUNNING). The
// running tasks go on. It returns the pause in force, which is an earlier
// one when the queue was paused already.
func PauseQueue(ctx context.Context, db Beginner, queue, reason string, by string) (QueuePause, error) {
	var p QueuePause
	if err := queuePause.put(ctx, db, queue, reason, by, &p.Queue, &p.Reason, &p.PausedBy, &p.PausedAt); err != nil {
		return QueuePause{}, fmt.Errorf("pause queue %s: %w", queue, err)
	}
	return p, nil
}

// ResumeQueue lifts the pause of queue, recording that by did, and
// announces it on ControlChannel; it reports whether the queue was paused.
func ResumeQueue(ctx context.Context, db Beginner, queue, by string) (bool, error) {
	resumed, err := queuePause.lift(ctx, db, queue, by)
	if err != nil {
		return false, fmt.Errorf("resume queue %s: %w", queue, err)
	}
	return resumed, nil
}

// BlockKind blocks kind: once it returns, no task of the kind starts, in
// any queue, until UnblockKind. Submissions are still accepted. It returns
// the block in force, which is an earlier one (with its reason) when the
// kind was blocked already.
func BlockKind(ctx context.Context, db Beginner, kind, reason string, by string) (KindBlock, error) {
	if reason == "" {
		return KindBlock{}, errors.New("block kind: a reason is required")
	}
	var b KindBlock
	if err := kindBlock.put(ctx, db, kind, reason, by, &b.Kind, &b.Reason, &b.BlockedBy, &b.BlockedAt); err != nil {
		return KindBlock{}, fmt.Errorf("block kind %s: %w", kind, err)
	}
	return b, nil
}

// UnblockKind lifts the block of kind, recording that by did, and
// announces it on ControlChannel; it reports whether the kind was blocked.
func UnblockKind(ctx context.Context, db Beginner, kind, by string) (bool, error) {
	unblocked, err := kindBlock.lift(ctx, db, kind, by)
	if err != nil {
		return false, fmt.Errorf("unblock kind %s: %w", kind, err)
	}
	return unblocked, nil
}

// ControlEvent records a pause, resume, block or unblock, and who did it.
type ControlEvent struct {
	ID        int64     `json:"control_event_id"`
	CreatedAt time.Time `json:"created_at"`
	// Action is PAUSED, RESUMED, BLOCKED or UNBLOCKED.
	Action string `json:"action"`
	// Queue names the queue of a pause or resume, Kind the kind of a block
	// or unblock; the other is empty.
	Queue  string `json:"queue,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Reason string `json:"reason"`
	Actor  string `json:"actor"`
}

// ControlEvents reads the newest limit records of data_manager.control_events.
func ControlEvents(ctx context.Context, db DB, limit int) ([]ControlEvent, error) {
	events, err := collect[ControlEvent](ctx, db, `
		SELECT control_event_id, created_at, action, coalesce(queue, ''), coalesce(kind, ''), reason, actor
		  FROM data_manager.control_events
		 ORDER BY control_event_id DESC
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read control events: %w", err)
	}
	return events, nil
}

// KnownQueue reports whether any context was ever submitted to queue, or it
// is paused: for commands run without a configuration naming it. An unknown
// name costs a scan of etl_contexts' queue index.
func KnownQueue(ctx context.Context, db DB, queue string) (bool, error) {
	var known bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM data_manager.etl_contexts WHERE queue = $1)
		    OR EXISTS (SELECT 1 FROM data_manager.queue_pauses WHERE queue = $1)`, queue).Scan(&known)
	if err != nil {
		return false, fmt.Errorf("look for queue %s: %w", queue, err)
	}
	return known, nil
}

// KnownKind is KnownQueue for a kind; an unknown name costs a scan of
// etl_contexts, as no index leads with the kind.
func KnownKind(ctx context.Context, db DB, kind string) (bool, error) {
	var known bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM data_manager.kinds WHERE kind = $1)
		    OR EXISTS (SELECT 1 FROM data_manager.etl_contexts WHERE kind = $1)
		    OR EXISTS (SELECT 1 FROM data_manager.kind_blocks WHERE kind = $1)`, kind).Scan(&known)
	if err != nil {
		return false, fmt.Errorf("look for kind %s: %w", kind, err)
	}
	return known, nil
}

// QueueStat is a row of the data_manager.dama_queue_stats view.
type QueueStat struct {
	Queue         *string        `json:"queue"`
	Kind          *string        `json:"kind"`
	Queued        int64          `json:"queued"`
	Scheduled     int64          `json:"scheduled"`
	Running       int64          `json:"running"`
	Retrying      int64          `json:"retrying"`
	Done24h       int64          `json:"done_24h"`
	Failed24h     int64          `json:"failed_24h"`
	Cancelled24h  int64          `json:"cancelled_24h"`
	OldestWaiting *time.Duration `json:"oldest_waiting"`
	Paused        bool           `json:"paused"`
	PauseReason   *string        `json:"pause_reason"`
	PausedAt      *time.Time     `json:"paused_at"`
	Blocked       bool           `json:"blocked"`
	BlockReason   *string        `json:"block_reason"`
	BlockedAt     *time.Time     `json:"blocked_at"`
	// Stalled counts the running tasks marked stalled.
	Stalled int64 `json:"stalled"`
}

// QueueStats reads dama_queue_stats, by queue and kind.
func QueueStats(ctx context.Context, db DB) ([]QueueStat, error) {
	stats, err := collect[QueueStat](ctx, db, `
		SELECT queue, kind, queued, scheduled, running, retrying, done_24h, failed_24h, cancelled_24h,
		       oldest_waiting, paused, pause_reason, paused_at, blocked, block_reason, blocked_at, stalled
		  FROM data_manager.dama_queue_stats
		 ORDER BY queue NULLS LAST, kind NULLS FIRST`)
	if err != nil {
		return nil, fmt.Errorf("read queue statistics: %w", err)
	}
	return stats, nil
}
