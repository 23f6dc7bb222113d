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
// the status page read it from any host, and a host that vanished still
// leaves it, the attempt's output is also kept in the database as a
// rolling tail of config.LogTailBytes (migration 25): every
// config.LogTailInterval the writer reads what the log file gained since
// the attempt started and appends it; the database drops what falls out of
// the tail. The command writes to the file itself, as before: nothing
// stands between it and its output, and a runner that dies loses at most
// the last interval of the tail, never the file.

// logTail is the attempt's log file as the writer reads it; only the
// writer's goroutine uses it, but for due.
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
	// off: the database refused the tail for good (a schema not yet
	// migrated, a role without the right, a run that is over).
	off bool
}

// openLogTail opens the attempt's log file again, to keep what is written
// to it from now on, keep bytes of it, every interval; nil when keep is
// not positive.
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

// close stops the timer and closes the file.
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
// since, at most the last keep bytes of it, protocol.MaxLogChunk at a time:
// a longer gain is written in chunks, one after the other.
func (t *logTail) read() (chunk []byte, start int64, err error) {
	if t.unsent != nil {
		return t.unsent, t.passed, nil
	}
	info, err := t.f.Stat()
	if err != nil {
		return nil, 0, err
	}
	size := info.Size()
	if size < t.pos {
		// Truncated (copytruncate): the file starts again, and so does
		// reading it; the output's offsets go on.
		t.pos = 0
	}
	if t.bounded {
		size = min(size, t.until)
	}
	n := size - t.pos
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

// wrote records that the chunk read was written.
func (t *logTail) wrote() {
	t.passed += int64(len(t.unsent))
	t.unsent = nil
}

// more reports whether the file holds what was not read yet (before
// until, once bounded).
func (t *logTail) more() bool {
	info, err := t.f.Stat()
	if err != nil {
		return false
	}
	size := info.Size()
	if t.bounded {
		size = min(size, t.until)
	}
	return size > t.pos
}

// keepTail makes the writer keep t, the attempt's log file, in the
// database; nil keeps nothing.
func (w *writer) keepTail(t *logTail) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Armed under mu: the writer's goroutine reads the tail, and its
	// timer, under mu first.
	if t != nil {
		t.arm(w)
	}
	w.tail = t
}

// tailKept returns the tail the writer keeps, nil for none.
func (w *writer) tailKept() *logTail {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tail
}

// serveTail appends what the log file gained, once its interval is up
// and nothing else waits; it reports false when there was nothing to do.
func (w *writer) serveTail(ctx context.Context) bool {
	t := w.tailKept()
	if t == nil || t.off || !t.due.Load() {
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
		// A gain longer than a chunk: the next one at the writer's next
		// chance, up to where the file was when the interval was up.
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

// flushTail queues the last append of the log file ahead of the events,
// which the attempt's outcome is among: the tail ends where the
// attempt did, on any host.
func (w *writer) flushTail(ctx context.Context) {
	t := w.tailKept()
	if t == nil {
		return
	}
	w.enqueue(ctx, func(ctx context.Context, conn dbConn) error {
		t.bound()
		for !t.off {
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

// appendTail appends what t's file gained, if anything, and reports
// whether it wrote.
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
	t.wrote()
	return true, nil
}

// retriable reports a write the same write may pass later: the connection
// was lost, or the server refused it for now (not for a right it lacks,
// which no retry gives).
func retriable(err error, conn dbConn) bool {
	switch classifyWriteError(err, conn) {
	case connectionLost:
		return true
	case serverBusy:
		return !strings.HasPrefix(etlcontext.ErrCode(err), "42")
	}
	return false
}

// tailRefused says why the database did not take t, unless it did or will
// next time; a refusal for good stops the tail.
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
