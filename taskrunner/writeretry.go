package taskrunner

import (
	"context"
	"errors"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/keeper"
)

// retry reports whether the write that failed with err is to be tried
// again: after a failure of the connection (dropped, to be made again), or
// after the server refused it for want of resources or cut it short (kept:
// in advisory lock mode it holds the lock).
func (w *writer) retry(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	switch classifyWriteError(err, w.conn) {
	case connectionLost:
		w.logger.Warn("write connection lost; the write is kept and tried again", "error", err)
		w.connErr = err
		w.conn.Close(context.WithoutCancel(ctx))
		return true
	case serverBusy:
		w.sayBusy("the server refused a write for now; it is kept and tried again", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return true
	}
	return false
}

// sayBusy logs a write refused for now, tried again every second: once a
// minute while the refusal lasts, so that a server read-only for an hour
// does not fill the task's log.
func (w *writer) sayBusy(msg string, err error) {
	if now := time.Now(); now.Sub(w.busySaid) >= time.Minute {
		w.logger.Warn(msg, "error", err)
		w.busySaid = now
	}
}

type writeError int

const (
	// statementError: the write itself is wrong; trying again would not help.
	statementError writeError = iota
	// connectionLost: the connection broke or timed out, or the server ended
	// the session.
	connectionLost
	// serverBusy: the server is short of resources (disk, memory),
	// cancelled the statement (statement_timeout) or rolled it back
	// (serialization failure, deadlock); the connection is fine.
	serverBusy
)

func classifyWriteError(err error, conn dbConn) writeError {
	if errors.Is(err, keeper.ErrUnavailable) {
		// The keeper could not reach the server; its session, and the
		// lock it holds, are fine.
		return serverBusy
	}
	if code := etlcontext.ErrCode(err); code != "" {
		switch {
		case conn == nil || conn.IsClosed(), etlcontext.ConnectionLost(code):
			return connectionLost
		case etlcontext.RequestRefused(code):
			// The write itself is refused: what the database cannot
			// store, or one of dama's guards.
			return statementError
		}
		// Anything else says nothing of the write: the server is short
		// of resources, cut it short, rolled it back, is read-only for
		// a switchover, lacks a grant being restored, or failed
		// inside. The same write may pass next time.
		return serverBusy
	}
	if conn == nil || conn.IsClosed() || etlcontext.Unreachable(err) || errors.Is(err, context.DeadlineExceeded) {
		return connectionLost
	}
	return statementError
}
