package etlcontext

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
	"github.com/jackc/pgx/v5"
)

// Progress is how far along a task's latest PROGRESS payload says it is.
type Progress struct {
	// Fraction is between 0 and 1.
	Fraction float64 `json:"fraction"`
	// Label says it as the task did: "3/10" or "30%".
	Label string `json:"label"`
}

// ParseProgress reads a PROGRESS payload of one of the two forms dama
// draws as a bar, {"step": 3, "of": 10} and {"percent": 30}; ok is false
// for any other payload, which is shown as it is.
func ParseProgress(payload json.RawMessage) (p Progress, ok bool) {
	var v struct {
		Step    *float64 `json:"step"`
		Of      *float64 `json:"of"`
		Percent *float64 `json:"percent"`
	}
	if len(payload) == 0 || payload[0] != '{' {
		return Progress{}, false
	}
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&v); err != nil {
		return Progress{}, false
	}
	switch {
	case v.Step != nil && v.Of != nil && *v.Of > 0:
		return Progress{Fraction: clamp(*v.Step / *v.Of), Label: number(*v.Step) + "/" + number(*v.Of)}, true
	case v.Percent != nil:
		return Progress{Fraction: clamp(*v.Percent / 100), Label: number(*v.Percent) + "%"}, true
	}
	return Progress{}, false
}

func clamp(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return min(max(f, 0), 1)
}

func number(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// DetectedBy is the field of the ERROR event a supervisor records for an
// attempt that died: the host of the supervisor that found it.
const DetectedBy = "detected_by"

// Failure is what the latest ERROR or CANCELLED event of a context says.
type Failure struct {
	// Reason is the event's reason, led by how the command ended when it is
	// the command's words ("" when it gives none).
	Reason string
	// TimedOut is set when the attempt was stopped at its kind's timeout.
	TimedOut bool
	// Died is set when a supervisor recorded the attempt's death: its
	// task process was gone, or had lost its lock, without a result.
	Died bool
}

// LastFailure returns what the latest ERROR or CANCELLED event of context
// id, of kind kind, says; the zero Failure when there is none.
func LastFailure(ctx context.Context, db DB, id int64, kind string) (Failure, error) {
	var (
		f          Failure
		code, exit string
	)
	err := db.QueryRow(ctx, `
		SELECT coalesce(payload->>'reason', payload::text, ''), coalesce(left(payload->>'exit_code', 12), ''),
		       coalesce(payload->>'exit', ''), coalesce(payload->'timed_out' = 'true'::jsonb, false),
		       coalesce(jsonb_typeof(payload) = 'object' AND payload ? $4, false)
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type IN ($2, $3)
		 ORDER BY event_id DESC LIMIT 1`,
		id, protocol.EventType(kind, protocol.EventError), protocol.EventType(kind, protocol.EventCancelled), DetectedBy).Scan(&f.Reason, &code, &exit, &f.TimedOut, &f.Died)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Failure{}, nil
	case err != nil:
		return Failure{}, fmt.Errorf("read the last failure of context %d: %w", id, err)
	}
	f.Reason = failedWith(strings.TrimSpace(f.Reason), code, exit)
	return f, nil
}

// SetProgress records payload as the latest progress of context id while
// its run runID is the one running: what the view and the status page show
// between the PROGRESS events, which sample it (every progress_interval).
// A run no longer current changes nothing, silently: its events say it.
func SetProgress(ctx context.Context, db DB, id int64, runID string, payload json.RawMessage) error {
	clean, err := cleanPayload(payload)
	if err != nil {
		return fmt.Errorf("encode progress of task %d: %w", id, err)
	}
	_, err = db.Exec(ctx, `
		UPDATE data_manager.etl_contexts SET progress = $3::jsonb, progress_at = now()
		 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning,
		id, runID, clean)
	if err != nil {
		return fmt.Errorf("set progress of task %d: %w", id, classify(err))
	}
	return nil
}

// Pace is how a running task's current attempt has gone so far: when it
// started, and its first progress of the attempt (nil before any).
type Pace struct {
	StartedAt       time.Time
	FirstProgress   json.RawMessage
	FirstProgressAt *time.Time
}

// Paces returns the Pace of each of the contexts ids that is RUNNING.
func Paces(ctx context.Context, db DB, ids []int64) (map[int64]Pace, error) {
	type paced struct {
		ID int64
		Pace
	}
	rows, err := collect[paced](ctx, db, `
		SELECT c.etl_context_id, a.started_at, f.payload, f.created_at
		  FROM data_manager.etl_contexts AS c
		  JOIN data_manager.etl_attempts AS a ON a.etl_context_id = c.etl_context_id AND a.run_id = c.run_id
		  LEFT JOIN LATERAL (
		      SELECT e.payload, e.created_at FROM data_manager.event_store AS e
		       WHERE e.etl_context_id = c.etl_context_id AND e.type = c.kind || ':PROGRESS' AND e.run_id = c.run_id
		       ORDER BY e.event_id LIMIT 1) AS f ON true
		 WHERE c.etl_context_id = ANY($1) AND c.etl_status = `+sqlRunning, ids)
	if err != nil {
		return nil, fmt.Errorf("read the pace of running tasks: %w", err)
	}
	paces := make(map[int64]Pace, len(rows))
	for _, r := range rows {
		paces[r.ID] = r.Pace
	}
	return paces, nil
}

// Remaining estimates how long a running task has left at now, from the
// pace between its first progress of the attempt and its latest, reported
// at latestAt: ok is false when the two do not tell (one sample, no
// advance, less than a second apart, or progress dama does not read).
func (p Pace) Remaining(latest json.RawMessage, latestAt *time.Time, now time.Time) (time.Duration, bool) {
	if p.FirstProgressAt == nil || latestAt == nil {
		return 0, false
	}
	first, ok1 := ParseProgress(p.FirstProgress)
	last, ok2 := ParseProgress(latest)
	span := latestAt.Sub(*p.FirstProgressAt)
	if !ok1 || !ok2 || span < time.Second || last.Fraction <= first.Fraction || last.Fraction >= 1 {
		return 0, false
	}
	perFraction := float64(span) / (last.Fraction - first.Fraction)
	left := time.Duration(perFraction*(1-last.Fraction)) - now.Sub(*latestAt)
	return max(left, 0), true
}
