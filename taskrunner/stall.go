package taskrunner

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// A command gone quiet for its kind's stall_after is noticed by its task
// process: it reads every line of the events pipe first hand, and it
// outlives its supervisor, so that a quiet task costs no statement and
// its count goes on whichever supervisor adopts it. The log, which the
// command writes itself, is looked at every tenth of stall_after (every
// 10 s at most), and so is the pipe: a report is dated to the look that
// found it, never earlier, so a task is never marked before its time.

// stallState is what a commandWatch knows of its command's last report.
type stallState struct {
	events *eventsReader
	// lines and output are the events pipe's lines and the command's
	// output (ownLog.output) at the last look; lastAt is when a look
	// last found more.
	lines, output int64
	lastAt        time.Time
	stalled       bool
}

// stallLooks starts the looks of a kind with a stall_after, from the
// command's start at startedAt; a nil channel for one without.
func (w *commandWatch) stallLooks(startedAt time.Time) (<-chan time.Time, func()) {
	after := time.Duration(w.r.kind.StallAfter)
	if after <= 0 {
		return nil, func() {}
	}
	w.stall.lastAt = startedAt
	w.stall.output, _ = w.r.opts.ownLog.output(w.r.logFile)
	t := time.NewTicker(min(after/10, 10*time.Second))
	return t.C, t.Stop
}

// lookForStall marks the command stalled once it reported nothing for
// stall_after, and clears the mark once it reports again.
func (w *commandWatch) lookForStall(now time.Time) {
	s, r, k := &w.stall, w.r, w.r.kind
	lines := s.events.lines.Load()
	output, ok := r.opts.ownLog.output(r.logFile)
	// A reader waiting for room in the writer holds the command back: a
	// database that is away does not stall it.
	active := lines != s.lines || (ok && output > s.output) || s.events.waiting.Load()
	s.lines = lines
	if ok {
		// Less than before: a truncated log (copytruncate), or the
		// runner's lines went elsewhere than the log; counted from here.
		s.output = output
	}
	switch {
	case w.stopReason != "":
		return
	case active && s.stalled:
		s.stalled = false
		quiet := now.Sub(s.lastAt).Round(time.Millisecond)
		r.logger.Info("command reports again", "quiet_for", quiet)
		r.w.event(protocol.EventUnstalled, map[string]any{"quiet_for": quiet.String()}, nil, false)
	case !active && !s.stalled && now.Sub(s.lastAt) >= time.Duration(k.StallAfter):
		s.stalled = true
		r.logger.Warn("command stalled: no progress, event or log line", "stall_after", k.StallAfter, "last_at", s.lastAt, "on_stall", k.OnStall)
		payload := map[string]any{"stall_after": k.StallAfter.String(), "last_at": s.lastAt.UTC().Format(time.RFC3339Nano), "on_stall": string(k.OnStall)}
		if k.OnStall == config.OnStallKill {
			w.expire(protocol.EventStalled, payload, etlcontext.StallReason(time.Duration(k.StallAfter), s.lastAt), false)
		} else {
			r.w.event(protocol.EventStalled, payload, nil, false)
		}
	}
	if active {
		s.lastAt = now
	}
}

// ownLog is what the runner's own logger writes through: what it writes
// to the task's log is not the command's output.
type ownLog struct {
	mu sync.Mutex
	w  io.Writer
	n  int64
}

func (o *ownLog) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, err := o.w.Write(p)
	o.n += int64(n)
	return n, err
}

// output is the size of log, the task's log file, less what o wrote: it
// grows with the command's output alone. false when log cannot be read.
func (o *ownLog) output(log *os.File) (int64, bool) {
	var own int64
	if o != nil {
		// No line of the runner's half written.
		o.mu.Lock()
		defer o.mu.Unlock()
		own = o.n
	}
	info, err := log.Stat()
	if err != nil {
		return 0, false
	}
	return info.Size() - own, true
}
