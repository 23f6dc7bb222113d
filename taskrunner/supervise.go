package taskrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/cgroup"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/runas"
	"github.com/dama-etl/dama/protocol"
)

// supervise runs the command and reacts to its exit, to cancellation, to
// the loss of the lock and to signals sent to the runner. Nothing here waits
// on the database: writes are queued, the lock is watched by its keeper.
func (r *runner) supervise(ctx context.Context) (int, error) {
	cfg := r.opts.Config
	eventsR, eventsW, err := os.Pipe()
	if err != nil {
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, protocol.Outcome{Reason: "create events pipe: " + err.Error()}, err)
	}
	defer eventsR.Close()
	// The lock is watched only from the command's start: make sure it is
	// still held right before, so the fencing window holds from the start.
	// A database restart since the lock was taken is ridden out here too:
	// nothing runs yet, so the runner may simply wait to take it again.
	seenLosses, err := r.lock.check(ctx, time.Duration(*cfg.ReconnectGrace))
	if err != nil {
		eventsW.Close()
		return r.finish(ctx, protocol.ExitLockLost, protocol.EventError, protocol.Outcome{Reason: "the lock was lost before the command started and not taken again within reconnect_grace"}, fmt.Errorf("take the lock again before starting the command: %w", err))
	}
	select {
	case sig := <-r.signals:
		// Signalled while the lock was checked, which may wait out a
		// database restart: the command has not started yet.
		eventsW.Close()
		return r.giveBack(ctx, sig)
	default:
	}
	// Before the command's first line of output: the log names its
	// attempt first.
	r.logger.Info("command starting", "attempt", r.ctx.Attempt, "host", r.opts.Host, "command", r.argv)
	startedAt := time.Now()
	proc, err := r.startCommand(eventsR, eventsW)
	eventsW.Close()
	if err != nil {
		err = fmt.Errorf("start command of kind %s: %w", r.ctx.Kind, err)
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, protocol.Outcome{Reason: err.Error()}, err)
	}

	events := r.readEvents(ctx, eventsR)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		r.lock.watch(watchCtx)
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()

	w := &commandWatch{r: r, proc: proc, seenLosses: seenLosses, stall: stallState{events: events}}
	waitErr := w.wait(proc.exited, startedAt)
	proc.done()
	// After the last of its output, which its processes, all gone now,
	// wrote to the log themselves.
	ended := append([]any{"pid", proc.pid, "after", time.Since(startedAt).Round(time.Millisecond)}, exitFields(waitErr)...)
	if w.stopReason != "" {
		ended = append(ended, "stopped", w.stopReason)
	}
	r.logger.Info("command exited", ended...)
	events.drain(ctx, time.Duration(*r.opts.Config.ReconnectGrace)+stmtTimeout)
	stopWatch()
	<-watchDone
	return r.commandEnded(ctx, w, waitErr)
}

// started is the kind's command once started: the runner's child, or a
// Starter's.
type started struct {
	// pid is the command's, where it runs.
	pid int
	// pgid is its process group on this host, whose orphans the runner
	// reaps; 0 for a Starter's.
	pgid   int
	exited <-chan error
	// signal sends a signal to its processes.
	signal func(syscall.Signal)
	// ended is closed once its processes are gone, which ends a
	// kill_grace's wait (killGroup); done, run once it exited, stops what
	// is left of them and closes ended.
	ended chan struct{}
	done  func()
}

// startCommand starts the command with its events pipe, through the
// Starter, or as a child.
func (r *runner) startCommand(eventsR, eventsW *os.File) (*started, error) {
	p := &started{ended: make(chan struct{})}
	if info, err := r.logFile.Stat(); err == nil {
		r.outputFrom = info.Size()
	}
	if s := r.opts.Starter; s != nil {
		c, err := s.Start(Command{
			Argv: r.argv, Env: r.commandEnv(r.args, r.checkpoint), KillGrace: time.Duration(*r.kind.KillGrace),
			EventsR: eventsR, EventsW: eventsW, Output: r.logFile,
		})
		if err != nil {
			return nil, err
		}
		p.pid, p.exited, p.signal = c.Pid, c.Exited, c.Signal
		p.done = func() {
			c.Done()
			close(p.ended)
		}
		return p, nil
	}
	cmd := r.command(eventsW)
	group, err := r.newGroup()
	if err != nil {
		return nil, err
	}
	exited, err := startLocked(cmd, group)
	if err != nil {
		if group != nil {
			_ = group.Delete()
		}
		return nil, err
	}
	pgid := cmd.Process.Pid
	var leaderTicks uint64
	if st, err := hostproc.ReadStat(pgid); err == nil {
		leaderTicks = st.StartTicks
	}
	r.w.call(func(ctx context.Context, conn dbConn) error {
		return etlcontext.RecordCommand(ctx, conn, r.ctx.ID, r.opts.RunID, pgid, leaderTicks)
	})
	p.pid, p.pgid, p.exited = pgid, pgid, exited
	p.signal = func(sig syscall.Signal) {
		_ = syscall.Kill(-pgid, sig)
		if sig == syscall.SIGKILL && group != nil {
			// Whatever session its processes moved to.
			_ = group.Kill()
		}
	}
	p.done = func() {
		// Stragglers the command left behind end with it, in its group or
		// not: the next attempt must not meet them.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		// The group is empty now: a pending SIGKILL must not reach
		// whoever reuses its id.
		close(p.ended)
		attempt := hostproc.Attempt{PGID: pgid, LeaderStartTicks: leaderTicks, Marker: protocol.RunIDEnv + "=" + r.opts.RunID}
		if group == nil {
			r.stopDescendants(attempt)
			return
		}
		r.emptyGroup(group)
		if r.subreaper {
			// A command of dama's own user may write the groups above
			// its own, and move out: still below the runner, its
			// subreaper, a walk of the runner's own children finds it.
			r.stopDescendants(attempt)
		}
		r.usage = r.usageOf(group)
		if err := group.Delete(); err != nil {
			r.logger.Warn("remove the attempt's control group", "error", err)
		}
	}
	return p, nil
}

// command is the kind's command, its output to the task's log and its
// events to eventsW, in a process group of its own that dies with the
// runner, as the kind's user when it names one.
func (r *runner) command(eventsW *os.File) *exec.Cmd {
	cmd := &exec.Cmd{
		Path:       r.path,
		Args:       r.argv,
		Env:        r.commandEnv(r.args, r.checkpoint),
		Stdout:     r.logFile,
		Stderr:     r.logFile,
		ExtraFiles: []*os.File{eventsW}, // descriptor 3: protocol.EventsFD
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if r.runAs != nil {
		cmd.SysProcAttr.Credential = r.runAs.Credential()
		cmd.Env = r.runAs.Env(cmd.Env)
	}
	return cmd
}

// commandWatch is what a running command is watched for, each concern in
// a method of its own: a cancellation, the lock, the kind's timeout and
// stall_after, signals to the runner, orphans to reap. The first reason to stop the
// command wins (stop).
type commandWatch struct {
	r    *runner
	proc *started

	// The lock: the losses seen so far, whether it is lost now, and the
	// end of reconnect_grace while it is.
	seenLosses int
	lockIsLost bool
	graceTimer <-chan time.Time

	timedOut   bool
	stopReason string
	stopCode   int

	// final: the first of the kind's timeout and stall_after to stop
	// the command (expire) failed the attempt for good.
	final bool
	stall stallState
}

// wait watches the command, started at startedAt, until it exits, and
// returns its exit error.
func (w *commandWatch) wait(exited <-chan error, startedAt time.Time) error {
	r := w.r
	signals, superseded := r.signals, r.w.superseded
	// Orphans of the command that exit are the runner's to reap.
	var orphaned chan os.Signal
	if r.subreaper && w.proc.pgid > 0 {
		orphaned = make(chan os.Signal, 1)
		signal.Notify(orphaned, syscall.SIGCHLD)
		defer signal.Stop(orphaned)
	}
	var timeout <-chan time.Time
	if d := r.kind.Timeout; d > 0 {
		timeout = time.After(time.Duration(d))
	}
	look, stopLooks := w.stallLooks(startedAt)
	defer stopLooks()
	for {
		select {
		case err := <-exited:
			return err
		case <-orphaned:
			r.reapOrphans(w.proc.pgid)
		case n := <-r.w.notify:
			if n.Channel == protocol.CancelChannel && n.Payload == strconv.FormatInt(r.ctx.ID, 10) {
				w.stop("cancel requested", protocol.ExitCancelled)
			}
		case <-superseded:
			// Closed for good: heard once.
			superseded = nil
			w.stop("the database refused a write of this run: it is no longer current", protocol.ExitLockLost)
		case <-r.lock.changed:
			w.lockChanged()
		case <-timeout:
			timeout = nil
			w.timeout()
		case now := <-look:
			w.lookForStall(now)
		case <-w.graceTimer:
			w.graceTimer = nil
			w.stop(fmt.Sprintf("the lock was not taken again within reconnect_grace (%s)", *r.opts.Config.ReconnectGrace), protocol.ExitLockLost)
		case sig := <-signals:
			reason := "runner received " + sig.String()
			if r.opts.Starter != nil {
				reason = r.opts.Starter.SignalReason(sig)
			}
			w.stop(reason, protocol.ExitFailed)
		}
	}
}

// stop stops the command (SIGTERM, then SIGKILL after the kind's
// kill_grace) for reason, the first one given.
func (w *commandWatch) stop(reason string, code int) {
	if w.stopReason != "" {
		return
	}
	w.stopReason, w.stopCode = reason, code
	w.r.logger.Info("stopping command", "reason", reason)
	go killGroup(w.proc.signal, time.Duration(*w.r.kind.KillGrace), w.proc.ended)
}

// lockChanged follows the lock: a loss starts reconnect_grace (or stops
// the command at once without one), the lock held again ends it, and a
// lock taken by another run stops the command.
func (w *commandWatch) lockChanged() {
	r := w.r
	state, losses, err := r.lock.get()
	if losses > w.seenLosses && !w.lockIsLost {
		// Lost, and perhaps held again already: the loss counts. The
		// writer's outage says so, and when it is back.
		w.lockIsLost = true
		grace := *r.opts.Config.ReconnectGrace
		if grace == 0 {
			w.stop("lock connection failed", protocol.ExitLockLost)
		} else {
			w.graceTimer = time.After(time.Duration(grace))
		}
	}
	w.seenLosses = losses
	switch {
	case state == lockHeld && w.lockIsLost:
		w.lockIsLost, w.graceTimer = false, nil
	case state == lockSuperseded:
		w.stop("the lock could not be taken again: "+err.Error(), protocol.ExitLockLost)
	}
}

// timeout records the kind's timeout and stops the command.
func (w *commandWatch) timeout() {
	k := w.r.kind
	w.expire(protocol.EventTimeout, map[string]any{
		"timeout": k.Timeout.String(), "on_timeout": string(k.OnTimeout), "kill_grace": (*k.KillGrace).String(),
	}, fmt.Sprintf("timed out after %s", k.Timeout), k.OnTimeout == config.OnTimeoutFail)
}

// expire records an event of suffix and stops the command for reason: the
// attempt fails as timed out, for good when final, and is otherwise
// retried from its checkpoint.
func (w *commandWatch) expire(suffix string, payload map[string]any, reason string, final bool) {
	if !w.timedOut {
		w.timedOut, w.final = true, final
	}
	w.r.w.event(suffix, payload, nil, false)
	w.stop(reason, protocol.ExitFailed)
}

// commandEnded records the attempt's outcome once the command ended with
// waitErr, having been stopped or not (w).
func (r *runner) commandEnded(ctx context.Context, w *commandWatch, waitErr error) (int, error) {
	exitCode := exitCodeOf(waitErr)
	switch {
	case w.stopCode == protocol.ExitLockLost:
		// Without the lock this process must not decide the outcome; the
		// database refuses the write anyway when another attempt started.
		return r.finish(ctx, protocol.ExitLockLost, protocol.EventError, protocol.Outcome{Reason: w.stopReason, ExitCode: new(exitCode)}, errors.New(w.stopReason))
	case w.stopCode == protocol.ExitCancelled:
		return r.finish(ctx, protocol.ExitCancelled, protocol.EventCancelled, protocol.Outcome{Reason: w.stopReason, ExitCode: new(exitCode)}, nil)
	case waitErr == nil && w.stopReason == "" && r.kind.AwaitChildren:
		return r.awaitChildren(ctx, r.signals)
	case waitErr == nil && w.stopReason == "":
		return r.finish(ctx, protocol.ExitDone, protocol.EventFinal, protocol.Outcome{ExitCode: new(0)}, nil)
	}
	reason := w.stopReason
	if reason == "" {
		reason = describeExit(waitErr)
	}
	logTail, replaced := r.tailOfLog(4096)
	if replaced.Any() {
		r.w.replacedIn(protocol.EventError+" log tail", replaced)
	}
	payload := protocol.Outcome{Reason: reason, ExitCode: new(exitCode), LogTail: new(logTail)}
	failure := r.lastFailure()
	if u := r.usage; w.stopReason == "" && u != nil && u.OOMKilled {
		// Whatever the command said: it is likely what a process
		// killed for its memory left behind. dama's words, not the
		// command's: no exit leads them (etlcontext's failedWith).
		payload.Reason = outOfMemory(u)
	} else if f := failure; w.stopReason == "" && f != nil {
		payload.Reason, payload.Exit = f.Error, reason
	} else {
		if line := r.lastWords(); w.stopReason == "" && line != "" {
			// Its last words stand in for the failure line it did not write.
			payload.Reason, payload.Exit = line, reason
		}
		if u != nil && u.ForksRefused > 0 && r.kind.Resources != nil {
			payload.Reason += "; " + forksRefused(u, r.kind.Resources.Pids)
		}
	}
	switch {
	case w.timedOut:
		payload.TimedOut = true
		if w.final {
			payload = payload.Final()
		}
	case w.stopReason == "" && failure != nil && failure.Retry != nil && !*failure.Retry,
		w.stopReason == "" && !r.kind.RetriesExit(exitCode):
		// The command said not to retry this failure.
		payload = payload.Final()
	}
	return r.finish(ctx, protocol.ExitFailed, protocol.EventError, payload, nil)
}

// fenceSessions sets in env, a command's, what names its libpq sessions by
// run runID, unless it names them itself, and has their server end a
// statement whose client died (protocol.SessionName, SessionCheckOption),
// after the command's own options.
func fenceSessions(env []string, runID string) []string {
	named, options := false, protocol.SessionCheckOption
	env = slices.DeleteFunc(env, func(kv string) bool {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "PGAPPNAME":
			named = true
		case "PGOPTIONS":
			if value != "" {
				options = value + " " + options
			}
			return true
		}
		return false
	})
	if !named {
		env = append(env, "PGAPPNAME="+protocol.SessionName(runID))
	}
	return append(env, "PGOPTIONS="+options)
}

func (r *runner) commandEnv(args, checkpoint json.RawMessage) []string {
	env := make([]string, 0, len(os.Environ())+9)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if config.Withheld(name) && (strings.HasPrefix(name, "DAMA_") || !slices.Contains(r.kind.PassEnv, name)) {
			// dama's credentials reach a command only when its kind asks.
			continue
		}
		env = append(env, kv)
	}
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	if r.kind.FencesSessions() {
		env = fenceSessions(env, r.opts.RunID)
	}
	if r.kind.Function != "" {
		env = append(env, protocol.ProcessEnv+"="+protocol.ProcessFunction, protocol.FunctionEnv+"="+r.kind.Function)
	}
	return append(env,
		protocol.ContextIDEnv+"="+strconv.FormatInt(r.ctx.ID, 10),
		protocol.KindEnv+"="+r.ctx.Kind,
		protocol.AttemptEnv+"="+strconv.Itoa(r.ctx.Attempt),
		protocol.ArgsEnv+"="+string(args),
		protocol.CheckpointEnv+"="+string(checkpoint),
		protocol.EventsFDEnv+"="+strconv.Itoa(protocol.EventsFD),
		protocol.RunIDEnv+"="+r.opts.RunID,
	)
}

// startLocked starts cmd from a goroutine locked to its OS thread, which then
// waits for it: Pdeathsig fires when the thread that forked the child exits,
// so that thread must live exactly as long as the command. The thread
// clears its inheritable and ambient capabilities first (they are a
// thread's, and the child is forked with the forking thread's): the
// command gets none of those a service manager may have granted dama to
// switch users. The thread ends with the goroutine, never serving
// another.
func startLocked(cmd *exec.Cmd, group *cgroup.Group) (<-chan error, error) {
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := runas.DropInherited(); err != nil {
			started <- err
			return
		}
		start := cmd.Start
		if group != nil {
			start = func() error { return group.Start(cmd) }
		}
		if err := start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// killGroup sends SIGTERM to the command's processes, and SIGKILL after
// grace if the command has not ended by then.
func killGroup(signal func(syscall.Signal), grace time.Duration, ended <-chan struct{}) {
	signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-timer.C:
		signal(syscall.SIGKILL)
	case <-ended:
	}
}
