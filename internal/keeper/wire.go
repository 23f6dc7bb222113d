package keeper

import (
	"encoding/binary"
	"encoding/json"
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
const Version = 7

// op is what a request asks of the keeper (session.handle serves each). A
// session's first request, and only that one, is its hello.
type op uint8

const (
	opHello op = iota + 1
	opDescribe
	opExec
	opBegin
	opCommit
	opRollback
	opLock
	opUnlock
	opListen
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
	SQL           string
	ParamOIDs     []uint32
	Params        values
	ParamFormats  []int16
	ResultFormats []int16
	// Timeout bounds the request at the keeper: what is left of the task
	// process's deadline.
	Timeout time.Duration
	// Begin, Commit, Rollback: 0 for the transaction, above for a
	// savepoint.
	Depth int
	// Lock: the task process's protocol.Version.
	Protocol int
	// Unlock: tell the supervisors that the task process ends.
	Announce bool
	// Listen.
	Channel string
}

// reply is a message from the keeper: the answer to the request before it
// (Notification nil), or a notification, sent at any time.
type reply struct {
	Err *wireError
	// Describe.
	ParamOIDs []uint32
	// Describe, Exec and Lock.
	Fields []pgconn.FieldDescription
	// Exec and Lock: each row's values.
	Rows []values
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
	// errBusy: no connection of the keeper's pool came free in time: the
	// statement was never sent, try again later.
	errBusy
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
	case e.Kind == errUnavailable, e.Kind == errBusy:
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
// checkpoint. maxHello bounds a session's first message, which gives its
// run's key, unchecked yet. minMessage is the least Config.MaxMessage: that of a
// notification, whose payload of 8,000 bytes at most JSON may write in 6
// bytes each (\u0001).
const (
	maxMessage = 64 << 20
	maxHello   = 16 << 10
	minMessage = 64 << 10
)

// values are a statement's parameters or a row, nil for NULL. They travel
// packed as a DataRow packs them (each value's length in 4 bytes, -1 for
// NULL, then its bytes) in one JSON string, not as a JSON array: an array
// of "" would make the decoder allocate a slice header for every 3 bytes
// of a frame, where the packed values allocate about their own size.
type values [][]byte

func (v values) MarshalJSON() ([]byte, error) {
	n := 0
	for _, x := range v {
		n += 4 + len(x)
	}
	packed := make([]byte, 0, n)
	for _, x := range v {
		if x == nil {
			packed = binary.BigEndian.AppendUint32(packed, math.MaxUint32)
			continue
		}
		packed = binary.BigEndian.AppendUint32(packed, uint32(len(x)))
		packed = append(packed, x...)
	}
	return json.Marshal(packed)
}

func (v *values) UnmarshalJSON(data []byte) error {
	var b []byte
	if err := json.Unmarshal(data, &b); err != nil {
		return err
	}
	if len(b) == 0 {
		*v = nil
		return nil
	}
	// A value takes 4 bytes at the least.
	out := make(values, 0, len(b)/4)
	for len(b) > 0 {
		if len(b) < 4 {
			return errors.New("a value cut short")
		}
		size := binary.BigEndian.Uint32(b)
		b = b[4:]
		if size == math.MaxUint32 {
			out = append(out, nil)
			continue
		}
		if uint64(size) > uint64(len(b)) {
			return errors.New("a value cut short")
		}
		out, b = append(out, b[:size:size]), b[size:]
	}
	*v = out
	return nil
}

// rowsOf is rows as the reply carries them.
func rowsOf(rows [][][]byte) []values {
	out := make([]values, len(rows))
	for i, r := range rows {
		out[i] = r
	}
	return out
}
