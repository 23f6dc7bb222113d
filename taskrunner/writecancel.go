package taskrunner

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// hear passes notification n on to the runner. A cancellation is a hint,
// which anyone who can connect may send: one naming this run's context is
// noted, and passed on only once the database's record confirms it
// (confirmCancel); others are ignored. The rest are wake-ups whose
// receiver reads the database itself: the ends of contexts that are not
// this one's children are dropped here, so that a flood of them cannot
// crowd out one that is, and when one is already waiting, n adds nothing.
func (w *writer) hear(n *pgconn.Notification) {
	w.mu.Lock()
	id := w.contextID
	w.mu.Unlock()
	switch n.Channel {
	case protocol.CancelChannel:
		if id != 0 && n.Payload == strconv.FormatInt(id, 10) {
			w.cancelHinted = true
			// Confirmed by the writer's next look.
			w.signal()
		}
		return
	case etlcontext.FinishedChannel:
		var f etlcontext.Finished
		// An empty payload stands for announcements missed while the
		// connection was made again.
		if n.Payload != "" && json.Unmarshal([]byte(n.Payload), &f) == nil && (f.ParentID == nil || *f.ParentID != id) {
			return
		}
	}
	select {
	case w.notify <- n:
	default:
	}
}

// confirmCancel reads whether the run's cancellation is recorded, as hinted,
// and if so passes it on to the runner. A connection that failed meanwhile
// is made again, which reads the record anew (hooks.resume).
func (w *writer) confirmCancel(ctx context.Context) {
	if wait := confirmInterval - time.Since(w.confirmedAt); wait > 0 {
		w.signalIn(wait)
		return
	}
	w.confirmedAt = time.Now()
	w.mu.Lock()
	id, runID := w.contextID, w.runID
	w.mu.Unlock()
	var requested bool
	err := w.exec(ctx, func(ctx context.Context, conn dbConn) (err error) {
		requested, err = etlcontext.CancelRequested(ctx, conn, id, runID)
		return err
	})
	switch {
	case err == nil && !requested:
		w.cancelHinted = false
		w.ignored++
		if time.Since(w.ignoredSaid) >= time.Minute {
			w.logger.Warn("ignored announced cancellations that the database does not record", "count", w.ignored)
			w.ignored, w.ignoredSaid = 0, time.Now()
		}
	case err == nil:
		select {
		case w.notify <- &pgconn.Notification{Channel: protocol.CancelChannel, Payload: strconv.FormatInt(id, 10)}:
			w.cancelHinted = false
		default:
			// The runner has yet to take what waits: look again soon.
			w.signalIn(confirmInterval)
		}
	case permanent(err):
		w.cancelHinted = false
	case w.conn.IsClosed():
	default:
		w.sayBusy("read the announced cancellation; tried again in a second", err)
		w.signalIn(time.Second)
	}
}

// signalIn wakes the writer's loop after d; one wake-up waits at a time.
func (w *writer) signalIn(d time.Duration) {
	if w.wakeSet.CompareAndSwap(false, true) {
		time.AfterFunc(d, func() {
			w.wakeSet.Store(false)
			w.signal()
		})
	}
}
