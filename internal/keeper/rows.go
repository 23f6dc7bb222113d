package keeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// rows are a statement's rows, all read already: pgx.Rows over what the
// keeper sent.
type rows struct {
	fields []pgconn.FieldDescription
	data   []values
	tag    pgconn.CommandTag
	m      *pgtype.Map
	i      int
	err    error
	closed bool
}

func (r *rows) Close()                                       { r.closed = true }
func (r *rows) Err() error                                   { return r.err }
func (r *rows) CommandTag() pgconn.CommandTag                { return r.tag }
func (r *rows) FieldDescriptions() []pgconn.FieldDescription { return r.fields }
func (r *rows) Conn() *pgx.Conn                              { return nil }
func (r *rows) TypeMap() *pgtype.Map                         { return r.m }

func (r *rows) Next() bool {
	if r.closed || r.err != nil || r.i >= len(r.data) {
		r.closed = true
		return false
	}
	r.i++
	return true
}

func (r *rows) RawValues() [][]byte {
	if r.i == 0 || r.i > len(r.data) {
		return nil
	}
	return r.data[r.i-1]
}

func (r *rows) Scan(dest ...any) error {
	values := r.RawValues()
	if values == nil {
		return errors.New("no row to scan: call Next first")
	}
	if err := pgx.ScanRow(r.m, r.fields, values, dest...); err != nil {
		r.err = err
		r.closed = true
		return err
	}
	return nil
}

func (r *rows) Values() ([]any, error) {
	values := r.RawValues()
	if values == nil {
		return nil, errors.New("no row: call Next first")
	}
	out := make([]any, len(r.fields))
	for i, fd := range r.fields {
		if values[i] == nil {
			continue
		}
		if t, ok := r.m.TypeForOID(fd.DataTypeOID); ok {
			v, err := t.Codec.DecodeValue(r.m, fd.DataTypeOID, fd.Format, values[i])
			if err != nil {
				return nil, fmt.Errorf("decode column %s: %w", fd.Name, err)
			}
			out[i] = v
			continue
		}
		if fd.Format == pgtype.TextFormatCode {
			out[i] = string(values[i])
		} else {
			out[i] = values[i]
		}
	}
	return out, nil
}

// row is QueryRow's result.
type row rows

func (r *row) Scan(dest ...any) error {
	rs := (*rows)(r)
	if rs.err != nil {
		return rs.err
	}
	if !rs.Next() {
		return pgx.ErrNoRows
	}
	err := rs.Scan(dest...)
	rs.Close()
	return err
}

// tx is a transaction of a session, or a savepoint in one (depth above 0).
type tx struct {
	c     *Conn
	depth int
	done  bool
}

func (t *tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	if err := t.c.do(ctx, &request{Op: opBegin, Depth: t.depth + 1}); err != nil {
		return nil, err
	}
	return &tx{c: t.c, depth: t.depth + 1}, nil
}

func (t *tx) Commit(ctx context.Context) error   { return t.end(ctx, opCommit) }
func (t *tx) Rollback(ctx context.Context) error { return t.end(ctx, opRollback) }

func (t *tx) end(ctx context.Context, o op) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	return t.c.do(ctx, &request{Op: o, Depth: t.depth})
}

var errUnsupported = errors.New("not supported by a lock keeper's session")

func (t *tx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, fmt.Errorf("copy from: %w", errUnsupported)
}

func (t *tx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	return errBatch{fmt.Errorf("send batch: %w", errUnsupported)}
}

func (t *tx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *tx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, fmt.Errorf("prepare: %w", errUnsupported)
}

func (t *tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.c.Exec(ctx, sql, args...)
}

func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.done {
		return &rows{err: pgx.ErrTxClosed, closed: true}, pgx.ErrTxClosed
	}
	return t.c.Query(ctx, sql, args...)
}

func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.done {
		return (*row)(&rows{err: pgx.ErrTxClosed, closed: true})
	}
	return t.c.QueryRow(ctx, sql, args...)
}

func (t *tx) Conn() *pgx.Conn { return nil }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return &rows{err: b.err, closed: true}, b.err }
func (b errBatch) QueryRow() pgx.Row                { return (*row)(&rows{err: b.err, closed: true}) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
