package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// finish records the attempt's outcome after everything queued before it,
// then releases the lock and announces the exit. While the database is
// away it waits up to reconnect_grace for it: the outcome of a command that
// ran for days is worth the wait. A runner that cannot record it leaves the
// context RUNNING with a free lock, and a supervisor records the attempt's
// death.
func (r *runner) finish(ctx context.Context, code int, suffix string, payload protocol.Outcome, cause error) (int, error) {
	r.w.flushTail(context.WithoutCancel(ctx))
	if payload.Usage == nil {
		payload.Usage = r.usage
	}
	r.w.outcome(suffix, payload, plainOutcome(payload))
	wait := time.Duration(*r.opts.Config.ReconnectGrace) + stmtTimeout
	if code == protocol.ExitLockLost {
		// Best effort: without its lock this attempt no longer decides, and
		// the supervisor records its death anyway.
		wait = 2 * time.Second
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	flushErr := r.w.flush(fctx)
	if flushErr != nil {
		r.logger.Error("record the outcome", "type", suffix, "error", flushErr)
		if code == protocol.ExitDone {
			code = protocol.ExitFailed
		}
		cause = errors.Join(cause, fmt.Errorf("record %s: %w", suffix, flushErr))
	}
	if err := r.lock.release(ctx, 2*time.Second); err != nil {
		r.logger.Warn("release lock", "error", err)
	}
	if flushErr != nil || r.w.over() {
		// The database is out of reach, or the run over: nobody would
		// hear the announcement, or it cannot be sent.
		return code, cause
	}
	nctx, ncancel := context.WithTimeout(ctx, 2*time.Second)
	defer ncancel()
	if err := r.w.do(nctx, func(ctx context.Context, conn dbConn) error {
		_, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", protocol.ExitedChannel, strconv.FormatInt(r.ctx.ID, 10))
		return err
	}); err != nil {
		r.logger.Warn("announce exit", "error", err)
	}
	return code, cause
}

// plainOutcome is payload without what may make the database refuse it
// (a log tail, long text): the exit code, the retry decision and a short
// reason are what the outcome's policy reads.
func plainOutcome(o protocol.Outcome) protocol.Outcome {
	clean := func(s string) string {
		s, _ = etlcontext.CleanText(protocol.TruncateUTF8(s, 512))
		return s
	}
	return protocol.Outcome{Reason: clean(o.Reason), ExitCode: o.ExitCode, Exit: clean(o.Exit), TimedOut: o.TimedOut, Retry: o.Retry, Usage: o.Usage, DetailsLost: true}
}

func (r *runner) setFailure(f *protocol.Failure) {
	r.failureMu.Lock()
	r.failure = f
	r.failureMu.Unlock()
}

func (r *runner) lastFailure() *protocol.Failure {
	r.failureMu.Lock()
	defer r.failureMu.Unlock()
	return r.failure
}

func exitCodeOf(err error) int {
	if ws, ok := waitStatus(err); ok {
		return ws.ExitStatus()
	}
	if err != nil {
		return -1
	}
	return 0
}

// waitStatus is the wait status of a command that ended with err.
func waitStatus(err error) (syscall.WaitStatus, bool) {
	var (
		exitErr    *exec.ExitError
		startedErr *ExitError
	)
	switch {
	case errors.As(err, &exitErr):
		ws, ok := exitErr.Sys().(syscall.WaitStatus)
		return ws, ok
	case errors.As(err, &startedErr):
		return startedErr.Status, true
	}
	return 0, false
}

func describeExit(err error) string {
	var startedErr *ExitError
	if errors.As(err, &startedErr) {
		return startedErr.Error()
	}
	if ws, ok := waitStatus(err); ok {
		return describeStatus(ws)
	}
	return fmt.Sprintf("command failed: %v", err)
}

// describeStatus says how a command ended.
func describeStatus(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		// SIGKILL, not Go's "killed": "command killed by killed".
		return "command killed by " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("command exited with code %d", ws.ExitStatus())
}

// exitFields are the log's fields for a command that ended with err.
func exitFields(err error) []any {
	if ws, ok := waitStatus(err); ok && ws.Signaled() {
		return []any{"signal", ws.Signal().String()}
	}
	return []any{"exit_code", exitCodeOf(err)}
}

// tailOfLog returns at most the last n bytes of the attempt's log file, starting at a
// line boundary, cleaned for the database, and what was replaced.
func (r *runner) tailOfLog(n int64) (string, etlcontext.Replaced) {
	f, err := r.logs.Reader(r.ctx.ID, r.logFile)
	if err != nil {
		return "", etlcontext.Replaced{}
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", etlcontext.Replaced{}
	}
	off := max(info.Size()-n, 0)
	buf := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return "", etlcontext.Replaced{}
	}
	s := string(buf)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return etlcontext.CleanText(s)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
