package etlcontext

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// AppendLog keeps chunk, which starts at byte start of the output of
// context id's run runID, in the run's tail in the database, and drops
// what falls out of its last keep bytes (data_manager.append_log,
// migration 25). A run that is no longer the running one is ErrStaleRun.
func AppendLog(ctx context.Context, db DB, id int64, runID string, start int64, chunk []byte, keep int64) error {
	if _, err := db.Exec(ctx, appendLogSQL, id, runID, start, chunk, keep, nil); err != nil {
		return fmt.Errorf("keep the log of task %d: %w", id, classify(err))
	}
	return nil
}

// appendLogSQL sets the run's key itself (keyedBy).
var appendLogSQL = keyedBy(6, ` SELECT data_manager.append_log($1, $2::uuid, $3, $4, $5) FROM k`)

// LogPos is a place in a context's kept output: a byte of an attempt's.
type LogPos struct {
	Attempt int   `json:"attempt"`
	Offset  int64 `json:"offset"`
}

// LogPiece is output of an attempt kept in the database, from Offset.
type LogPiece struct {
	Attempt int
	Offset  int64
	Data    []byte
}

// End is where the piece ends.
func (p LogPiece) End() LogPos { return LogPos{p.Attempt, p.Offset + int64(len(p.Data))} }

// LogSince returns the output of context id kept in the database after
// from, in order, attempt by attempt, up to about maxBytes (at least one
// piece when there is any). A piece may start past from (of a later
// attempt, or after output that was not kept): a gap the caller may say.
func LogSince(ctx context.Context, db DB, id int64, from LogPos, maxBytes int) ([]LogPiece, error) {
	rows, err := db.Query(ctx, `
		SELECT attempt, start_byte, data FROM data_manager.log_chunks
		 WHERE etl_context_id = $1 AND (attempt, start_byte + octet_length(data)) > ($2, $3)
		 ORDER BY attempt, start_byte`, id, from.Attempt, from.Offset)
	if err != nil {
		return nil, fmt.Errorf("read the log of task %d: %w", id, err)
	}
	defer rows.Close()
	var (
		pieces []LogPiece
		size   int
	)
	for rows.Next() && (len(pieces) == 0 || size < maxBytes) {
		var p LogPiece
		if err := rows.Scan(&p.Attempt, &p.Offset, &p.Data); err != nil {
			return nil, fmt.Errorf("read the log of task %d: %w", id, err)
		}
		// What was read already is cut: before from, and what a chunk
		// written again over a longer stretch repeats of the one before.
		end := from
		if n := len(pieces); n > 0 {
			end = pieces[n-1].End()
		}
		if p.Attempt == end.Attempt && p.Offset < end.Offset {
			if p.Offset+int64(len(p.Data)) <= end.Offset {
				continue
			}
			p.Data, p.Offset = p.Data[end.Offset-p.Offset:], end.Offset
		}
		// Pieces that follow on are one.
		if n := len(pieces); n > 0 && pieces[n-1].End() == (LogPos{p.Attempt, p.Offset}) {
			pieces[n-1].Data = append(pieces[n-1].Data, p.Data...)
		} else {
			pieces = append(pieces, p)
		}
		size += len(p.Data)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the log of task %d: %w", id, err)
	}
	return pieces, nil
}

// LogEnd is where the output of context id that the database keeps ends:
// the end of its latest attempt's; the zero LogPos when none is kept.
func LogEnd(ctx context.Context, db DB, id int64) (LogPos, error) {
	var end LogPos
	err := db.QueryRow(ctx, `
		SELECT attempt, start_byte + octet_length(data) FROM data_manager.log_chunks
		 WHERE etl_context_id = $1 ORDER BY attempt DESC, start_byte DESC LIMIT 1`, id).Scan(&end.Attempt, &end.Offset)
	if err != nil && err != pgx.ErrNoRows {
		return LogPos{}, fmt.Errorf("read the log of task %d: %w", id, err)
	}
	return end, nil
}
