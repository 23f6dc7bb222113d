package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// finish records the attempt's outcome after everything queued before it,
// then releases the lock and announces the exit. While the database is
// away it waits up to reconnect_grace for it, and for as long as the lock
// holds: the outcome of a command that ran for days is worth the wait. A runner that cannot record it leaves the
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
	// Slow to come through while the lock holds, or is lost for less than
	// reconnect_grace at a time (advisory mode takes it again with the
	// writer's connection, which a write's timeout ends): a host's burst of
	// exits on a busy server. Waited for, or the task would run again.
	var lostAt time.Time
	for errors.Is(flushErr, context.DeadlineExceeded) && ctx.Err() == nil {
		if r.lock.holds() {
			lostAt = time.Time{}
		} else if lostAt.IsZero() {
			lostAt = time.Now()
		} else if time.Since(lostAt) >= time.Duration(*r.opts.Config.ReconnectGrace) {
			break
		}
		fctx, cancel := context.WithTimeout(ctx, stmtTimeout)
		flushErr = r.w.flush(fctx)
		cancel()
	}
	if flushErr != nil {
		r.logger.Error("record the outcome", "type", suffix, "error", flushErr)
		if code == protocol.ExitDone {
			code = protocol.ExitFailed
		}
		cause = errors.Join(cause, fmt.Errorf("record %s: %w", suffix, flushErr))
	}
	// Unless the database is out of reach, or the run over: nobody would
	// hear the announcement, or it cannot be sent.
	announce := flushErr == nil && !r.w.over()
	announced, err := r.lock.release(ctx, 2*time.Second, announce)
	if err != nil {
		r.logger.Warn("release the task's lock", "error", err)
	}
	if !announce || announced {
		return code, cause
	}
	nctx, ncancel := context.WithTimeout(ctx, 2*time.Second)
	defer ncancel()
	if err := r.w.do(nctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.Announce(ctx, conn, r.ctx.ID)
	}); err != nil {
		r.logger.Warn("tell the supervisors that the task process ends", "error", err)
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

// output returns at most the last n bytes the log holds of this attempt's
// run of its command (its output, and this process's lines since), from
// the start of a line.
func (r *runner) output(n int64) string {
	f, err := r.logs.Reader(r.ctx.ID, r.logFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(info.Size()-n, r.outputFrom)
	buf := make([]byte, max(info.Size()-off, 0))
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	s := string(buf)
	if off > r.outputFrom {
		// The end of a line cut short.
		_, s, _ = strings.Cut(s, "\n")
	}
	return s
}

// tailOfLog returns at most the last n bytes of the attempt's output
// (output), cleaned for the database, and what was replaced.
func (r *runner) tailOfLog(n int64) (string, etlcontext.Replaced) {
	return etlcontext.CleanText(r.output(n))
}

// lastWords is the last line this attempt's command wrote in the log, in
// its last 4 KiB, cut to 512 bytes and cleaned for the database: the lines
// the task process wrote there, and an earlier attempt's, are left out.
func (r *runner) lastWords() string {
	lines := strings.Split(r.output(4096), "\n")
	own := " component=" + logComponent
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		// This process's own line, or its end after the command's last
		// words when they had no newline.
		if at := strings.Index(line, "time="); at >= 0 && strings.Contains(line[at:], own) {
			line = line[:at]
		}
		// What a progress bar (\r) drew last.
		if at := strings.LastIndexByte(strings.TrimRight(line, "\r "), '\r'); at >= 0 {
			line = line[at+1:]
		}
		if line = strings.TrimSpace(line); line != "" {
			line, _ = etlcontext.CleanText(protocol.TruncateUTF8(line, 512))
			return line
		}
	}
	return ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
