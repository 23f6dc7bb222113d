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

	"github.com/dama-etl/dama/taskrunner/protocol"
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
		f := *v.Step / *v.Of
		return Progress{Fraction: clamp(f), Label: number(*v.Step) + "/" + number(*v.Of)}, true
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
	// Reason is the event's reason ("" when it gives none).
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
		reason   *string
		timedOut *bool
		died     bool
	)
	err := db.QueryRow(ctx, `
		SELECT coalesce(payload->>'reason', payload::text), payload->'timed_out' = 'true'::jsonb,
		       coalesce(jsonb_typeof(payload) = 'object' AND payload ? $4, false)
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type IN ($2, $3)
		 ORDER BY event_id DESC LIMIT 1`,
		id, protocol.EventType(kind, protocol.EventError), protocol.EventType(kind, protocol.EventCancelled), DetectedBy).Scan(&reason, &timedOut, &died)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Failure{}, nil
	case err != nil:
		return Failure{}, fmt.Errorf("read the last failure of context %d: %w", id, err)
	}
	var f Failure
	if reason != nil {
		f.Reason = strings.TrimSpace(*reason)
	}
	f.TimedOut = timedOut != nil && *timedOut
	f.Died = died
	return f, nil
}

// SetProgress records payload as the latest progress of context id while
// its run runID is the one running: what the view and the status page show
// between the PROGRESS events, which are only a sample of it (every
// progress_interval). A run that is no longer current changes nothing, and
// no error says so: its events are refused, and say it.
func SetProgress(ctx context.Context, db DB, id int64, runID string, payload json.RawMessage) error {
	clean, _, err := cleanPayload(payload)
	if err != nil {
		return fmt.Errorf("encode progress of etl context %d: %w", id, err)
	}
	var p *string
	if clean != nil {
		s := string(clean)
		p = &s
	}
	_, err = db.Exec(ctx, `
		UPDATE data_manager.etl_contexts SET progress = $3::jsonb, progress_at = now()
		 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning,
		id, runID, p)
	if err != nil {
		return fmt.Errorf("set progress of etl context %d: %w", id, classify(err))
	}
	return nil
}
