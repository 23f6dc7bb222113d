package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

const (
	// awaitRecount bounds how long an awaiting task process goes without
	// counting its children, should an announcement be lost.
	awaitRecount = time.Minute
	// awaitHinted is the least time between two counts that announcements
	// of a child's end ask for.
	awaitHinted = 100 * time.Millisecond
)

// awaitChildren follows the success of the command of a kind with
// await_children: holding the lock, it waits for the announcements of its
// children's ends, and records DONE once every child is DONE, or an ERROR
// that fails the task for good once one is FAILED or CANCELLED.
func (r *runner) awaitChildren(ctx context.Context, signals <-chan os.Signal) (int, error) {
	// The children submitted last must be written before they are counted.
	fctx, cancel := context.WithTimeout(ctx, time.Duration(*r.opts.Config.ReconnectGrace)+stmtTimeout)
	err := r.w.flush(fctx)
	cancel()
	if err == nil {
		lctx, cancel := context.WithTimeout(ctx, 2*stmtTimeout)
		err = r.w.listenToo(lctx, etlcontext.FinishedChannel)
		cancel()
	}
	if err != nil {
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, protocol.Outcome{Reason: "could not wait for the children: " + err.Error()}, err)
	}
	if n := r.w.refused(); n > 0 {
		// The command meant them to exist: the tree is incomplete for good.
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, protocol.Outcome{
			Reason: fmt.Sprintf("%d children could not be submitted (see the WARNING events)", n),
		}.Final(), nil)
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { r.lock.watch(watchCtx) })
	stop := func() {
		stopWatch()
		watching.Wait()
	}
	defer stop()
	// The outcome releases the lock: the watch of its connection ends
	// first, as the command's does.
	finish := func(code int, suffix string, o protocol.Outcome, cause error) (int, error) {
		stop()
		return r.finish(ctx, code, suffix, o, cause)
	}

	recount := time.NewTicker(awaitRecount)
	defer recount.Stop()
	announced := false
	self := r.ctx.ID
	for {
		// A recount a notification asks for comes awaitHinted after the
		// last one ended at the soonest: anyone who can connect may send
		// them.
		var (
			hinted    <-chan time.Time
			counts    etlcontext.Children
			cancelled bool
		)
		cctx, cancel := context.WithTimeout(ctx, 2*stmtTimeout)
		err := r.w.do(cctx, func(ctx context.Context, conn dbConn) error {
			var err error
			if counts, err = etlcontext.ChildCounts(ctx, conn, self); err != nil {
				return err
			}
			// A cancellation's announcement may have been missed (a full
			// notification buffer, a reconnection): look.
			cancelled, err = etlcontext.CancelRequested(ctx, conn, self, r.opts.RunID)
			return err
		})
		cancel()
		counted := time.Now()
		switch {
		case errors.Is(err, etlcontext.ErrStaleRun):
			return protocol.ExitLockLost, errors.New("the run is no longer current")
		case err != nil:
			r.logger.Warn("count the children", "error", err)
		case cancelled:
			return finish(protocol.ExitCancelled, protocol.EventCancelled, protocol.Outcome{Reason: "cancel requested while awaiting the children"}, nil)
		case counts.Failed() > 0:
			return finish(protocol.ExitFailed, protocol.EventError, protocol.Outcome{
				Reason:   fmt.Sprintf("%d children did not finish DONE", counts.Failed()),
				Children: childCounts(counts),
			}.Final(), nil)
		case counts.Pending() == 0:
			return finish(protocol.ExitDone, protocol.EventFinal, protocol.Outcome{ExitCode: new(0), Children: childCounts(counts)}, nil)
		case !announced:
			announced = true
			r.w.event(protocol.EventAwaiting, map[string]any{"children": counts}, nil, false)
			r.logger.Info("command succeeded; awaiting the children", "children", counts)
		}
	wait:
		for {
			select {
			case n := <-r.w.notify:
				switch n.Channel {
				case protocol.CancelChannel:
					if n.Payload == strconv.FormatInt(self, 10) {
						return finish(protocol.ExitCancelled, protocol.EventCancelled, protocol.Outcome{Reason: "cancel requested while awaiting the children"}, nil)
					}
				case etlcontext.FinishedChannel:
					// Of a child, or standing for missed ones: the writer
					// passes on no other (hear).
					if hinted == nil {
						hinted = time.After(time.Until(counted.Add(awaitHinted)))
					}
				}
			case <-hinted:
				break wait
			case <-r.w.superseded:
				return protocol.ExitLockLost, errors.New("the database refused a write of this run: it is no longer current")
			case <-r.lock.changed:
				if state, _, err := r.lock.get(); state == lockSuperseded {
					return finish(protocol.ExitLockLost, protocol.EventError, protocol.Outcome{Reason: "the lock could not be taken again: " + err.Error()}, err)
				}
			case <-recount.C:
				break wait
			case sig := <-signals:
				return finish(protocol.ExitFailed, protocol.EventError, protocol.Outcome{Reason: "runner received " + sig.String() + " while awaiting the children"}, nil)
			}
		}
	}
}

// childCounts is counts as an outcome carries them.
func childCounts(counts etlcontext.Children) map[string]int {
	out := make(map[string]int, len(counts))
	for status, n := range counts {
		out[string(status)] = n
	}
	return out
}
