package keeper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
)

// Version is the version of the keeper's wire protocol: it is part of the
// socket's name, so that task processes of releases that speak different
// versions each find a keeper of their own.
const Version = 3

// op is what a request asks of the keeper.
type op uint8

const (
	// opHello opens a session for the run of a context; it must come first
	// and only once. The keeper checks that the session's key is that
	// run's (etlcontext.HoldsKeyOf).
	opHello op = iota + 1
	// opDescribe returns the statement's parameter and result types.
	opDescribe
	// opExec runs one statement with its parameters, encoded by the task
	// process, in a transaction of its own or in the session's open one,
	// and returns its rows.
	opExec
	// opBegin, opCommit and opRollback open and end the session's
	// transaction, or a savepoint in it (Depth above 0).
	opBegin
	opCommit
	opRollback
	// opLock takes the session's context's lock on the keeper's lock
	// session; opUnlock releases it.
	opLock
	opUnlock
	// opListen passes on the notifications of a channel from now on.
	opListen
	// opPing checks that the keeper serves, and its lock session with it.
	opPing
)

// request is a message from a task process.
type request struct {
	Op op
	// Hello.
	Version   int
	ContextID int64
	RunKey    string
	// Statements.
	SQL       string
	ParamOIDs []uint32
	// Params are the parameters' values, packed (packValues), so that an
	// empty value and NULL stay apart.
	Params        []byte
	ParamFormats  []int16
	ResultFormats []int16
	// Timeout bounds the request at the keeper: what is left of the task
	// process's deadline.
	Timeout time.Duration
	// Begin, Commit, Rollback: 0 for the transaction, above for a
	// savepoint.
	Depth int
	// Listen.
	Channel string
}

// reply is a message from the keeper: the answer to the request before it
// (Notification nil), or a notification, sent at any time.
type reply struct {
	Err *wireError
	// Describe.
	ParamOIDs []uint32
	// Describe and Exec.
	Fields []pgconn.FieldDescription
	// Exec: each row's values, packed (packValues).
	Rows [][]byte
	Tag  string
	// Notification, when set, makes the reply a notification.
	Notification *pgconn.Notification
}

// errKind says what kind of failure a wireError is.
type errKind uint8

const (
	// errStatement: the server refused the statement (PgError says how)
	// or the request was wrong.
	errStatement errKind = iota + 1
	// errUnavailable: the keeper could not reach the server for a
	// statement: try again later.
	errUnavailable
	// errLocked: another session holds the context's lock.
	errLocked
	// errRefused: the session is not allowed what it asked (a wrong key).
	errRefused
)

type wireError struct {
	Kind    errKind
	Message string
	PgError *pgconn.PgError
}

// ErrUnavailable is what a request fails with when the keeper could not
// reach the server to carry it out: the same request may pass later.
var ErrUnavailable = errors.New("the lock keeper cannot reach the database")

// ErrRefused is what opening a session fails with when the keeper does
// not accept its key: the run is not current, or not this context's.
var ErrRefused = errors.New("the lock keeper refused the session")

func (e *wireError) err() error {
	switch {
	case e == nil:
		return nil
	case e.PgError != nil:
		return e.PgError
	case e.Kind == errUnavailable:
		return fmt.Errorf("%w: %s", ErrUnavailable, e.Message)
	case e.Kind == errLocked:
		return fmt.Errorf("%s: %w", e.Message, etlcontext.ErrLocked)
	case e.Kind == errRefused:
		// A key the database does not take is that of a run that is over.
		return fmt.Errorf("%w: %s: %w", ErrRefused, e.Message, etlcontext.ErrStaleRun)
	}
	return errors.New(e.Message)
}

// maxMessage bounds one message either way: a statement's parameters or
// its rows. A task process's largest writes are batches of events of at
// most 1 MiB of payloads, and its largest reads a context's arguments and
// checkpoint. maxHello bounds a session's first message, before its run's
// key was checked.
const (
	maxMessage = 64 << 20
	maxHello   = 16 << 10
)

// packValues packs values as a DataRow does: each value's length as 4
// bytes, -1 for NULL, then its bytes.
func packValues(values [][]byte) []byte {
	n := 0
	for _, v := range values {
		n += 4 + len(v)
	}
	out := make([]byte, 0, n)
	for _, v := range values {
		if v == nil {
			out = binary.BigEndian.AppendUint32(out, math.MaxUint32)
			continue
		}
		out = binary.BigEndian.AppendUint32(out, uint32(len(v)))
		out = append(out, v...)
	}
	return out
}

// unpackValues reads what packValues packed, n values.
func unpackValues(b []byte, n int) ([][]byte, error) {
	// A value takes 4 bytes at the least: n, told by the other side, is
	// not believed beyond that.
	values := make([][]byte, 0, min(n, len(b)/4))
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errors.New("a value cut short")
		}
		size := binary.BigEndian.Uint32(b)
		b = b[4:]
		if size == math.MaxUint32 {
			values = append(values, nil)
			continue
		}
		if uint64(size) > uint64(len(b)) {
			return nil, errors.New("a value cut short")
		}
		values = append(values, b[:size:size])
		b = b[size:]
	}
	if len(values) != n {
		return nil, fmt.Errorf("%d values where %d are expected", len(values), n)
	}
	return values, nil
}
