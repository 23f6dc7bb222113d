package taskrunner

import (
	"context"
	"io"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/protocol"
)

// eventsReader queues what the command reports on its events pipe.
type eventsReader struct {
	r       *runner
	pipe    *os.File
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan error
	lines   atomic.Int64 // lines handed on
	waiting atomic.Bool  // set while the reader waits for room in the writer
	lost    atomic.Int64 // lines not queued because the run ended first
	read    atomic.Int64 // bytes read from the pipe
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// drainBound is the most the events pipe can still give once every process
// of the attempt is gone: what the pipe holds, what the reader has
// buffered, and one line being read. More than that is written by a
// process that escaped the attempt, and is not waited for.
func drainBound(pipe *os.File) int64 {
	capacity, err := unix.FcntlInt(pipe.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil || capacity <= 0 {
		capacity = 1 << 20 // the default pipe-max-size
	}
	return int64(capacity) + 64<<10 + protocol.MaxEventLine
}

func (r *runner) readEvents(ctx context.Context, pipe *os.File) *eventsReader {
	er := &eventsReader{r: r, pipe: pipe, done: make(chan error, 1)}
	er.ctx, er.cancel = context.WithCancel(ctx)
	go func() {
		var stopped error
		er.done <- readEvents(countingReader{pipe, &er.read}, func(rep reported) {
			defer er.lines.Add(1)
			switch {
			case stopped == nil:
				er.waiting.Store(true)
				stopped = r.report(er.ctx, rep)
				er.waiting.Store(false)
				if stopped == nil {
					return
				}
			case rep.failure != nil:
				// Why the command fails needs no room: it is never lost.
				r.setFailure(rep.failure)
				return
			}
			er.lost.Add(1)
		})
	}()
	return er
}

// report queues one line of the events pipe, waiting for room.
func (r *runner) report(ctx context.Context, rep reported) error {
	switch {
	case rep.failure != nil:
		r.setFailure(rep.failure)
		r.w.replacedIn(protocol.TypeFailure, rep.replaced)
		return nil
	case rep.child != nil:
		r.w.replacedIn(protocol.TypeSubmit, rep.replaced)
		return r.w.submitChild(ctx, *rep.child)
	}
	return r.w.report(ctx, rep.suffix, rep.payload, rep.meta, rep.isError, rep.replaced)
}

// drain waits until everything the command wrote is queued: once its
// processes are gone, for the pipe to end or be quiet for 2 s (an escaped
// process holds it open); while the writer is behind, for as long as it
// makes progress, and up to wait without any. A WARNING, queued ahead of
// the outcome, counts the lines not stored.
func (er *eventsReader) drain(ctx context.Context, wait time.Duration) {
	defer er.cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	quietSince, progressSince := time.Now(), time.Now()
	seen := er.lines.Load()
	bound := er.read.Load() + drainBound(er.pipe)
	wasWaiting := false
	stop := func(why string) {
		// Lines are no longer queued, but what is left is still read for a
		// moment: a failure line at the end still counts.
		er.cancel()
		select {
		case <-er.done:
		case <-time.After(2 * time.Second):
			er.pipe.Close()
			<-er.done
		}
		er.r.logger.Warn(why, "lines_lost", er.lost.Load())
		er.r.w.event(protocol.EventWarning, nil, map[string]any{
			"problem":    why,
			"lines_lost": er.lost.Load(),
		}, false)
	}
	for {
		select {
		case err := <-er.done:
			if err != nil {
				er.r.logger.Warn("read events", "error", err)
			}
			if n := er.lost.Load(); n > 0 {
				er.r.logger.Warn("lines of the events pipe were not stored: the run ended first", "lines_lost", n)
			}
			return
		case <-tick.C:
			now := time.Now()
			waiting := er.waiting.Load()
			if n := er.lines.Load(); n != seen {
				// Only the writer's progress extends the wait: lines that keep
				// coming from a process that escaped the attempt do not.
				if waiting || wasWaiting {
					progressSince = now
				}
				seen, quietSince = n, now
			}
			wasWaiting = waiting
			if er.read.Load() > bound {
				stop("more was written to the events pipe after the command's processes ended than the pipe holds: a process that escaped the attempt writes to it; the rest is discarded")
				return
			}
			if now.Sub(progressSince) >= wait {
				stop("the events the command wrote could not all be stored within " + wait.String() + " of the last progress; the rest of the pipe is discarded")
				return
			}
			if waiting {
				quietSince = now
				continue
			}
			if now.Sub(quietSince) >= 2*time.Second {
				stop("events pipe still open 2s after the command's processes ended; what is written to it later is discarded")
				return
			}
		case <-ctx.Done():
			stop("the task process is stopping: the events not yet read are discarded")
			return
		}
	}
}
