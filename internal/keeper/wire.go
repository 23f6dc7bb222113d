package keeper

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
)

// Version is the version of the keeper's wire protocol: it is part of the
// socket's name, so that task processes of releases that speak different
// versions each find a keeper of their own.
const Version = 5

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
	SQL       string
	ParamOIDs []uint32
	// Params are the parameters' values: nil for NULL (JSON's null, where
	// an empty value is "").
	Params        [][]byte
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
	// Exec: each row's values, nil for NULL.
	Rows [][][]byte
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
// key was checked. minMessage is the least Config.MaxMessage: that of a
// notification, whose payload of 8,000 bytes at most JSON may write in 6
// bytes each (\u0001).
const (
	maxMessage = 64 << 20
	maxHello   = 16 << 10
	minMessage = 64 << 10
)
