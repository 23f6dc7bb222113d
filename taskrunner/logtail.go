package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// A task's log file lives on the host that ran it. So that dama logs and
// the status page read it from any host, even one that vanished, the
// attempt's output is also kept in the database as a rolling tail of
// config.LogTailBytes: every config.LogTailInterval the writer appends what
// the log file gained. The command writes to the file itself: nothing
// stands between it and its output, and a runner that dies loses at most
// the last interval of the tail, never the file.

// logTail is the log file as the writer reads it, on its goroutine (but due).
type logTail struct {
	f *os.File
	// pos is how far the file was read; passed is how much of the
	// attempt's output was appended or dropped, where the next chunk
	// starts in it.
	pos, passed int64
	// unsent is a chunk read whose write failed, sent again as it is
	// before anything else is read: a write whose reply was lost and a
	// later one never overlap.
	unsent []byte
	// until, once bounded, is where the append under way stops: the
	// file's size when its interval was up (so that an interval writes
	// at most keep bytes, however fast the command writes), or, for the
	// last, when the attempt ended (whatever a process left behind writes
	// after).
	until   int64
	bounded bool
	// buf is reused by each read: a chatty command's tail costs the
	// runner one chunk's memory, not a chunk's garbage a write.
	buf   []byte
	keep  int64
	every time.Duration
	// due: every has passed since the last write; set by the timer.
	due   atomic.Bool
	timer *time.Timer
	// off: the database refused the tail for good.
	off bool
	// aside is why the database refused for good the statement of the
	// outcome with the last chunk: the outcome is tried alone, and only
	// if the database takes it was the chunk at fault.
	aside error
	// last: the attempt ended, and the tail's last chunk, read and left
	// unsent, goes with its outcome, in the outcome's statement (lastOfTail).
	last bool
}

// openLogTail opens the attempt's log file again, to keep keep bytes of what
// is written to it from now on, every interval; nil when keep is not positive.
func (r *runner) openLogTail(keep int64, every time.Duration) (*logTail, error) {
	if keep <= 0 {
		return nil, nil
	}
	f, err := r.logs.Reader(r.ctx.ID, r.logFile)
	if err != nil {
		return nil, fmt.Errorf("keep the log's tail: %w", err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open log file to keep its tail: %w", err)
	}
	return &logTail{f: f, pos: info.Size(), keep: keep, every: every}, nil
}

func (t *logTail) close() {
	if t.timer != nil {
		t.timer.Stop()
	}
	t.f.Close()
}

// arm makes the tail due once its interval is up, and wakes w then.
func (t *logTail) arm(w *writer) {
	if t.timer == nil {
		t.timer = time.AfterFunc(t.every, func() {
			t.due.Store(true)
			w.signal()
		})
		return
	}
	t.timer.Reset(t.every)
}

// read returns the next chunk to write and where it starts in the
// attempt's output: the one whose write failed, or what the file gained
// since, at most the last keep bytes of it, protocol.MaxLogChunk at a time.
func (t *logTail) read() (chunk []byte, start int64, err error) {
	if t.unsent != nil {
		return t.unsent, t.passed, nil
	}
	info, err := t.f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if info.Size() < t.pos {
		// Truncated (copytruncate): the file starts again, and so does
		// reading it; the output's offsets go on.
		t.pos = 0
	}
	n := t.end(info.Size()) - t.pos
	if n > t.keep {
		// More than the tail keeps: the older part would be dropped at once.
		t.pos += n - t.keep
		t.passed += n - t.keep
		n = t.keep
	}
	n = min(n, protocol.MaxLogChunk)
	if n <= 0 {
		return nil, t.passed, nil
	}
	if int64(cap(t.buf)) < n {
		t.buf = make([]byte, protocol.MaxLogChunk)
	}
	m, err := t.f.ReadAt(t.buf[:n], t.pos)
	if m == 0 && err != nil {
		return nil, 0, err
	}
	t.unsent = t.buf[:m]
	t.pos += int64(m)
	return t.unsent, t.passed, nil
}

// end is where reading a file of size stops: before until, once bounded.
func (t *logTail) end(size int64) int64 {
	if t.bounded {
		return min(size, t.until)
	}
	return size
}

// more reports whether the file holds what was not read yet.
func (t *logTail) more() bool {
	info, err := t.f.Stat()
	return err == nil && t.end(info.Size()) > t.pos
}

// keepTail makes the writer keep t in the database; nil keeps nothing.
func (w *writer) keepTail(t *logTail) {
	if t != nil {
		t.arm(w) // before the writer's goroutine loads t
	}
	w.tail.Store(t)
}

// serveTail appends what the log file gained once its interval is up; false: nothing to do.
func (w *writer) serveTail(ctx context.Context) bool {
	t := w.tail.Load()
	if t == nil || t.off || t.last || !t.due.Load() {
		return false
	}
	t.due.Store(false)
	if !t.bounded {
		t.bound()
	}
	wrote, err := w.appendTail(ctx, t)
	switch {
	case err != nil && classifyWriteError(err, w.conn) == connectionLost && ctx.Err() == nil:
		w.retry(ctx, err) // closes the connection, to be made again
		t.due.Store(true)
		return true
	case err == nil && wrote && t.more():
		// A gain longer than a chunk: the next one at the writer's next chance.
		t.due.Store(true)
		return true
	}
	t.bounded = false
	t.arm(w)
	w.tailRefused(t, err)
	return wrote || err != nil
}

// bound makes the append under way stop where the file is now.
func (t *logTail) bound() {
	if info, err := t.f.Stat(); err == nil {
		t.until, t.bounded = info.Size(), true
	}
}

// flushTail queues the last appends of the log file ahead of the events,
// the attempt's outcome among them: the tail ends where the attempt did.
// The last chunk is read here and written with the outcome (lastOfTail):
// the appends before are for a tail longer than a chunk.
func (w *writer) flushTail(ctx context.Context) {
	t := w.tail.Load()
	if t == nil {
		return
	}
	w.enqueue(ctx, func(ctx context.Context, conn dbConn) error {
		t.bound()
		t.last = true
		for !t.off {
			if _, _, err := t.read(); err != nil {
				w.logger.Warn("read the log file to keep its tail; the database keeps no more of it", "error", err)
				t.off = true
				return nil
			}
			if !t.more() {
				return nil
			}
			wrote, err := w.appendTail(ctx, t)
			if err != nil && ctx.Err() == nil && retriable(err, w.conn) {
				return err // tried again, on a new connection if need be
			}
			// Anything else is said here: nobody waits for this call.
			w.tailRefused(t, err)
			if err != nil || !wrote || !t.more() {
				return nil
			}
		}
		return nil
	})
}

// lastOfTail is the tail's last chunk, read by flushTail, to write with
// the attempt's outcome; nil when there is none.
func (w *writer) lastOfTail() *etlcontext.LogChunk {
	t := w.tail.Load()
	if t == nil || !t.last || t.off || t.aside != nil || len(t.unsent) == 0 {
		return nil
	}
	return &etlcontext.LogChunk{Start: t.passed, Data: t.unsent, Keep: t.keep}
}

// sent records that the chunk read was written.
func (t *logTail) sent() {
	t.passed += int64(len(t.unsent))
	t.unsent = nil
}

// appendTail appends what t's file gained, and reports whether it wrote.
func (w *writer) appendTail(ctx context.Context, t *logTail) (bool, error) {
	chunk, start, err := t.read()
	if err != nil {
		w.logger.Warn("read the log file to keep its tail; the database keeps no more of it", "error", err)
		t.off = true
		return false, nil
	}
	if len(chunk) == 0 {
		return false, nil
	}
	w.mu.Lock()
	id, runID := w.contextID, w.runID
	w.mu.Unlock()
	if err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.AppendLog(ctx, conn, id, runID, start, chunk, t.keep)
	}); err != nil {
		return false, err
	}
	t.sent()
	return true, nil
}

// retriable reports a write that may pass later: the connection was lost, or
// the server refused it for now (not for a right it lacks, class 42).
func retriable(err error, conn dbConn) bool {
	kind := classifyWriteError(err, conn)
	return kind == connectionLost || kind == serverBusy && !strings.HasPrefix(etlcontext.ErrCode(err), "42")
}

// tailRefused stops the tail, saying why, when the database refused it for good.
func (w *writer) tailRefused(t *logTail, err error) {
	switch {
	case err == nil, retriable(err, w.conn):
		// Taken, or refused for now: the next interval tries again.
	case errors.Is(err, etlcontext.ErrStaleRun):
		t.off = true
	default:
		// A schema not yet migrated, a role without the right, what the
		// database cannot store: the file keeps the log.
		w.logger.Warn("the database refused the log's tail; from now on only the log file keeps it", "error", err)
		t.off = true
	}
}
