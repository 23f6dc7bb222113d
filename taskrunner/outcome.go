// Package taskrunner is the detached process that runs one attempt of one
// task (`dama taskrunner`, started by the supervisor).
//
// It takes the context's lock and holds it for as long as it lives: the lock
// is the proof that the task is running, and a second runner for the same
// context exits at once with protocol.ExitLocked. In row lock mode that is an
// advisory lock keyed by the context id and the INITIAL event row FOR
// UPDATE, in a transaction left open on a connection of its own, with the
// writes on a second connection; in advisory lock mode, the advisory lock at
// session level, with no transaction open, on the one connection that also
// carries the writes. Every write carries the attempt's run id, which the
// database checks. While the task runs quietly nothing is sent to the
// server: the lock connection is watched by waiting on it, and probed by the
// kernel when silent.
//
// The kind's command runs as the runner's child in its own process group,
// with its stdin on /dev/null, its output appended to the task's log file and
// a pipe on descriptor 3 for the events it reports. The command gets SIGKILL
// when the runner dies; its descendants are left to the supervisor, which
// finds them by process group and DAMA_RUN_ID. When the lock connection
// fails, the command runs on for at most reconnect_grace while the lock is
// taken again under the same run, then its process group is stopped: it
// runs unlocked for at most FenceWindow.
//
// A function kind's command is the runner's own program, started again to
// call the kind's Func with a Task (see RunFunction): everything above
// holds for it unchanged.
package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// finish records the attempt's outcome after everything queued before it,
// then releases the lock and announces the exit. While the database is
// away it waits up to reconnect_grace for it: the outcome of a command that
// ran for days is worth the wait. A runner that cannot record it leaves the
// context RUNNING with a free lock, and a supervisor records the attempt's
// death.
func (r *runner) finish(ctx context.Context, code int, suffix string, payload map[string]any, cause error) (int, error) {
	r.w.flushTail(context.WithoutCancel(ctx))
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
func plainOutcome(payload map[string]any) map[string]any {
	plain := make(map[string]any, len(payload)+1)
	for k, v := range payload {
		switch v := v.(type) {
		case string:
			if k == "log_tail" {
				continue
			}
			s, _ := etlcontext.CleanText(protocol.TruncateUTF8(v, 512))
			plain[k] = s
		case bool, int:
			plain[k] = v
		}
	}
	plain["details_lost"] = true
	return plain
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
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return exitErr.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func describeExit(err error) string {
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "command killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("command exited with code %d", exitErr.ExitCode())
	}
	return fmt.Sprintf("command failed: %v", err)
}

// tail returns at most the last n bytes of the file at path, starting at a
// line boundary, cleaned for the database, and what was replaced.
func tail(path string, n int64) (string, etlcontext.Replaced) {
	f, err := os.Open(path)
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
