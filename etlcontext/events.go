package etlcontext

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/protocol"
)

// Event is a row of data_manager.event_store.
type Event struct {
	ID        int64           `json:"event_id"`
	ContextID int64           `json:"etl_context_id"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	Meta      json.RawMessage `json:"meta"`
	Error     bool            `json:"error"`
	Attempt   int             `json:"attempt"`
	RunID     *string         `json:"run_id"`
	CreatedAt time.Time       `json:"created_at"`
	// Summary says in a line what an attempt's failure or cancellation
	// event (protocol.Outcome) says went wrong, as a task's reason does,
	// and how many lines of the log's tail it kept (RecentEvents).
	Summary string `json:"summary,omitempty" db:"-"`
}

// NewEvent is an event to append to a context.
type NewEvent struct {
	ContextID int64
	// Type is the full type, <kind>:<SUFFIX>.
	Type    string
	Payload any
	Meta    any
	Error   bool
	// RunID is the current run's; nil only for a context never started.
	RunID *string
	// Seq, when set, numbers the event within its run: an event appended
	// again with the same run id and Seq (a write retried after a lost
	// connection) is stored once.
	Seq *int
}

// Append writes an event and returns its id. The database derives the
// context's status from it and refuses it with ErrFinished or ErrStaleRun.
func Append(ctx context.Context, db DB, e NewEvent) (int64, error) {
	payload, meta, err := e.encode()
	if err != nil {
		return 0, err
	}
	var id int64
	err = db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO data_manager.event_store (etl_context_id, type, payload, meta, error, run_id, seq)
			VALUES ($1, $2, $3, $4, $5, $6::uuid, $7)
			ON CONFLICT (etl_context_id, run_id, seq) WHERE seq IS NOT NULL DO NOTHING
			RETURNING event_id)
		SELECT event_id FROM ins
		UNION ALL
		SELECT event_id FROM data_manager.event_store
		 WHERE $7::int IS NOT NULL AND etl_context_id = $1 AND run_id = $6::uuid AND seq = $7
		 LIMIT 1`, e.ContextID, e.Type, payload, meta, e.Error, e.RunID, e.Seq).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("append %s event to task %d: %w", e.Type, e.ContextID, classify(err))
	}
	return id, nil
}

// LogChunk is output of a run to keep in its log's tail, as AppendLog
// keeps it: Data starts at byte Start of the run's output, and the tail
// keeps its last Keep bytes.
type LogChunk struct {
	Start int64
	Data  []byte
	Keep  int64
}

// AppendEvents writes events of one context and run in one statement, in
// order: as Append, one round trip for many. The first event's context and
// run id stand for all. An event the database refuses fails them all.
// log, when set, is appended to the run's log tail (AppendLog) first, in
// the same statement: the last of the tail with the run's outcome, which
// ends the run and takes no more of it.
func AppendEvents(ctx context.Context, db DB, events []NewEvent, log *LogChunk) error {
	if len(events) == 0 {
		return nil
	}
	types := make([]string, len(events))
	payloads := make([][]byte, len(events))
	metas := make([][]byte, len(events))
	errs := make([]bool, len(events))
	seqs := make([]*int, len(events))
	for i, e := range events {
		var err error
		if payloads[i], metas[i], err = e.encode(); err != nil {
			return err
		}
		types[i], errs[i], seqs[i] = e.Type, e.Error, e.Seq
	}
	first := events[0]
	sql, args := appendEventsSQL, []any{first.ContextID, first.RunID, types, payloads, metas, errs, seqs, nil}
	if log != nil {
		sql, args = appendEventsLogSQL, append(args, log.Start, log.Data, log.Keep)
	}
	_, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("append %d events to task %d: %w", len(events), first.ContextID, classify(err))
	}
	return nil
}

// appendEventsSQL and appendEventsLogSQL set the run's key themselves
// (keyedBy): an uncorrelated subquery in WHERE, which the server runs
// once, before the first row is inserted, reads k, and the log's CTE.
var (
	appendEventsSQL    = keyedBy(8, insertEvents(`(SELECT count(*) FROM k) = 1`))
	appendEventsLogSQL = keyedBy(8, `,
		log AS MATERIALIZED (SELECT data_manager.append_log($1, $2::uuid, $9, $10, $11) FROM k)`+
		insertEvents(`(SELECT count(*) FROM log) = 1`))
)

// insertEvents is AppendEvents' insert, once cond holds.
func insertEvents(cond string) string {
	return `
		INSERT INTO data_manager.event_store (etl_context_id, type, payload, meta, error, run_id, seq)
		SELECT $1, e.type, e.payload, e.meta, e.error, $2::uuid, e.seq
		  FROM unnest($3::text[], $4::jsonb[], $5::jsonb[], $6::boolean[], $7::int[])
		       WITH ORDINALITY AS e(type, payload, meta, error, seq, n)
		 WHERE ` + cond + `
		 ORDER BY e.n
		ON CONFLICT (etl_context_id, run_id, seq) WHERE seq IS NOT NULL DO NOTHING`
}

// encode encodes e's payload and meta as JSON that jsonb accepts: cleaned
// here, whoever the caller, so that no bytes make a write fail.
func (e NewEvent) encode() (payload, meta []byte, err error) {
	if payload, err = cleanPayload(e.Payload); err != nil {
		return nil, nil, fmt.Errorf("encode payload of %s event: %w", e.Type, err)
	}
	if meta, err = cleanPayload(e.Meta); err != nil {
		return nil, nil, fmt.Errorf("encode meta of %s event: %w", e.Type, err)
	}
	return payload, meta, nil
}

// EventStored reports whether the event numbered seq of run runID is
// stored for context id: whether a write whose reply was lost committed.
func EventStored(ctx context.Context, db DB, id int64, runID string, seq int) (bool, error) {
	var stored bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM data_manager.event_store
		                WHERE etl_context_id = $1 AND run_id = $2::uuid AND seq = $3)`,
		id, runID, seq).Scan(&stored)
	if err != nil {
		return false, fmt.Errorf("look for event %d of run %s of task %d: %w", seq, runID, id, classify(err))
	}
	return stored, nil
}

// Events returns the events of context id in the order they were written.
func Events(ctx context.Context, db DB, id int64) ([]Event, error) {
	events, err := collect[Event](ctx, db, `
		SELECT event_id, etl_context_id, type, payload, meta, error, attempt, run_id::text, created_at
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1
		 ORDER BY event_id`, id)
	if err != nil {
		return nil, fmt.Errorf("read events of task %d: %w", id, err)
	}
	return events, nil
}

// TruncatedKey marks a JSON value read cut short, in its place:
// {"dama_truncated": {"bytes": <its size as text>, "head": "<its start>"}}.
const TruncatedKey = "dama_truncated"

// boundedJSON is SQL that reads the jsonb expression expr as itself when its
// text is at most the parameter limit long, and else as the TruncatedKey
// marker holding its size and its first limit characters.
//
// The subquery's OFFSET 0 keeps the planner from pulling it up, which would
// write expr::text out three times: a 900 KiB payload takes 8 ms to turn
// into text, and a page of 40 of them 1.5 s instead of 0.37 s.
func boundedJSON(expr, limit string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s IS NULL OR %[2]s <= 0 THEN %[1]s ELSE (
		SELECT CASE WHEN octet_length(t) <= %[2]s THEN %[1]s
		       ELSE jsonb_build_object('%[3]s', jsonb_build_object('bytes', octet_length(t), 'head', left(t, %[2]s))) END
		  FROM (SELECT %[1]s::text AS t OFFSET 0) AS bounded) END`,
		expr, limit, TruncatedKey)
}

// RecentEvents returns the newest limit events of context id, oldest first,
// each payload and meta read up to maxPayload bytes (0: whole), and each
// outcome's Summary. An outcome's log tail is left out of its payload, and
// counted in its Summary: EventOf reads it whole.
func RecentEvents(ctx context.Context, db DB, id int64, limit, maxPayload int) ([]Event, error) {
	// An outcome's parts are read apart from its payload, which a long
	// reason may have cut short.
	type withOutcome struct {
		Event
		Reason, Code, Exit *string
		TailLines          *int
	}
	rows, err := collect[withOutcome](ctx, db, `
		SELECT * FROM (
			SELECT event_id, etl_context_id, type,
			       `+boundedJSON(`CASE WHEN jsonb_typeof(payload->'log_tail') = 'string' THEN payload - 'log_tail' ELSE payload END`, "$3::int")+`,
			       `+boundedJSON("meta", "$3::int")+`,
			       error, attempt, run_id::text, created_at,
			       o.reason, o.code, o.exit,
			       length(o.tail) - length(replace(o.tail, E'\n', ''))
			  FROM data_manager.event_store AS e
			  LEFT JOIN LATERAL (
			       SELECT left(e.payload->>'reason', 1024) AS reason, left(e.payload->>'exit_code', 12) AS code,
			              left(e.payload->>'exit', 256) AS exit, e.payload->>'log_tail' AS tail
			        WHERE jsonb_typeof(e.payload) = 'object' AND jsonb_typeof(e.payload->'reason') = 'string'
			          AND (e.type LIKE '%:' || $4 OR e.type LIKE '%:' || $5)) AS o ON true
			 WHERE etl_context_id = $1
			 ORDER BY event_id DESC
			 LIMIT $2) AS e
		 ORDER BY event_id`, id, limit, maxPayload, protocol.EventError, protocol.EventCancelled)
	if err != nil {
		return nil, fmt.Errorf("read events of task %d: %w", id, err)
	}
	events := make([]Event, len(rows))
	for i, r := range rows {
		events[i] = r.Event
		if r.Reason == nil {
			continue
		}
		events[i].Summary = failedWith(*r.Reason, deref(r.Code), deref(r.Exit))
		if r.TailLines != nil && *r.TailLines > 0 {
			events[i].Summary += fmt.Sprintf(" (and the log's last %d lines)", *r.TailLines)
		}
	}
	return events, nil
}

// EventOf returns event eventID of context id, its payload and meta each
// read up to maxPayload bytes (0: whole).
func EventOf(ctx context.Context, db DB, id, eventID int64, maxPayload int) (Event, error) {
	e, err := collectOne[Event](ctx, db, `
		SELECT event_id, etl_context_id, type, `+boundedJSON("payload", "$3::int")+`, `+boundedJSON("meta", "$3::int")+`,
		       error, attempt, run_id::text, created_at
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND event_id = $2`, id, eventID, maxPayload)
	if errors.Is(err, pgx.ErrNoRows) {
		return Event{}, fmt.Errorf("event %d of task %d: %w", eventID, id, ErrNotFound)
	}
	if err != nil {
		return Event{}, fmt.Errorf("read event %d of task %d: %w", eventID, id, err)
	}
	return e, nil
}

// LatestPayload returns the payload of the newest event of context id with
// the given suffix (CHECKPOINT, PROGRESS, ...), or nil when there is none.
func LatestPayload(ctx context.Context, db DB, id int64, suffix string) (json.RawMessage, error) {
	var payload json.RawMessage
	err := db.QueryRow(ctx, `
		SELECT e.payload
		  FROM data_manager.event_store AS e
		  JOIN data_manager.etl_contexts AS c USING (etl_context_id)
		 WHERE e.etl_context_id = $1 AND e.type = c.kind || ':' || $2
		 ORDER BY e.event_id DESC
		 LIMIT 1`, id, suffix).Scan(&payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read latest %s of task %d: %w", suffix, id, err)
	}
	return payload, nil
}

// payloads selects Payloads' two of context c; suffix is the parameter
// that holds the CHECKPOINT event suffix.
func payloads(suffix string) string {
	return `
	(SELECT i.payload FROM data_manager.event_store AS i WHERE i.event_id = c.initial_event_id),
	(SELECT e.payload FROM data_manager.event_store AS e
	  WHERE e.etl_context_id = c.etl_context_id AND e.type = c.kind || ':' || ` + suffix + `
	  ORDER BY e.event_id DESC LIMIT 1)`
}

// Payloads returns, in one round trip, the task's arguments (the INITIAL
// event's payload) and its latest CHECKPOINT payload (nil when there is
// none).
func Payloads(ctx context.Context, db DB, id int64) (args, checkpoint json.RawMessage, err error) {
	err = db.QueryRow(ctx, `
		SELECT `+payloads("$2")+`
		  FROM data_manager.etl_contexts AS c
		 WHERE c.etl_context_id = $1 AND c.initial_event_id IS NOT NULL`, id, protocol.EventCheckpoint).Scan(&args, &checkpoint)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fmt.Errorf("read arguments of task %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read arguments and checkpoint of task %d: %w", id, err)
	}
	return args, checkpoint, nil
}
