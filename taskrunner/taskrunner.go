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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/taskrunner/protocol"
	"github.com/dama-etl/dama/version"
)

// Options configure one run.
type Options struct {
	// DatabaseURL names the database; it comes from the environment.
	DatabaseURL string
	// Config is the configuration the command of the task's kind is taken
	// from; Run gives it its defaults (config.Config.WithDefaults).
	Config *config.Config
	// ContextID is the context to run.
	ContextID int64
	// RunID is the run id the supervisor prepared for this launch.
	RunID string
	// RunKey is the run's key the supervisor prepared (Launch.KeyFD): each of
	// the runner's sessions holds it, which opens the run's rows to a
	// member of dama_task. Empty sets none.
	RunKey string
	// LockMode is how to hold the lock, chosen by the supervisor from the
	// kind's configuration; empty means row.
	LockMode config.LockMode
	// Host and HostID name the host the runner runs on (see hostproc).
	Host, HostID string
	// Ready, when set, receives one byte once the runner holds the lock and
	// has recorded its process, and is then closed.
	Ready io.WriteCloser
	// Logger receives the runner's own log lines.
	Logger *slog.Logger
	// Submit records the children the command submits on its events pipe;
	// nil refuses them (each "submit" line is then recorded as a WARNING).
	Submit SubmitFunc
	// Funcs are the functions of function kinds this program registers: a
	// task of a function kind whose function is missing here is unfit for
	// this host. The runner calls none of them; it starts its own program
	// again as the task's function process (see RunFunction).
	Funcs Funcs
}

// selfExe names the file the running program started from, even once a
// redeploy replaced or deleted it: a function process is of its runner's
// release.
const selfExe = "/proc/self/exe"

// stmtTimeout bounds every statement the runner sends: no database call
// waits forever.
const stmtTimeout = 10 * time.Second

// Run runs the task and returns the process exit code.
func Run(ctx context.Context, opts Options) int {
	// The database URL is in this process's environment: a process of the
	// same user (the command, which runs as this user) must not read it
	// from /proc/<pid>/environ, nor trace this one. The command itself is
	// dumpable again from its exec.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// A signal never kills the runner outright, before its command starts
	// either: it is caught (and, once the command runs, stops it). Caught,
	// not ignored: an ignored signal would stay ignored in the command.
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(caught)
	if opts.Config != nil {
		opts.Config = opts.Config.WithDefaults()
	}
	r := &runner{opts: opts, signals: caught, logger: opts.Logger.With("etl_context_id", opts.ContextID, "run_id", opts.RunID)}
	code, err := r.run(ctx)
	if err != nil {
		r.logger.Error("taskrunner", "error", err, "exit_code", code)
	}
	if r.opts.Ready != nil {
		r.opts.Ready.Close()
	}
	return code
}

type runner struct {
	opts   Options
	logger *slog.Logger
	// signals receives SIGTERM, SIGINT and SIGHUP sent to the runner from
	// its start.
	signals <-chan os.Signal

	ctx  *etlcontext.Context
	kind config.Kind
	// path and argv are the command to run: the kind's, or for a function
	// kind this program again.
	path string
	argv []string
	// failure is what the command said, last, of why it fails; set by the
	// events reader, guarded by failureMu.
	failure   *protocol.Failure
	failureMu sync.Mutex
	logPath   string
	logFile   *os.File
	// args and checkpoint are handed to the command.
	args, checkpoint json.RawMessage
	w                *writer
	writerStarted    bool
	lock             *lockKeeper
}

// checkCancel runs first on every new write connection but the first: a
// cancellation announced while the runner was away from the database is
// delivered as if heard. It fails with etlcontext.ErrStaleRun when the run
// is no longer current.
func (r *runner) checkCancel(ctx context.Context, conn *pgx.Conn) error {
	requested, err := etlcontext.CancelRequested(ctx, conn, r.opts.ContextID, r.opts.RunID)
	if err != nil || !requested {
		return err
	}
	// Run on the writer's goroutine: the writer passes it on.
	r.w.cancelHinted = true
	return nil
}

func (r *runner) run(ctx context.Context) (int, error) {
	cfg := r.opts.Config
	mode := r.opts.LockMode
	if mode == "" {
		mode = config.LockModeRow
	}
	r.lock = newLockKeeper(r.opts.DatabaseURL, r.opts.ContextID, r.opts.RunID, mode, cfg.HeartbeatInterval, r.logger)
	r.lock.runKey = r.opts.RunKey
	hooks := writerHooks{resume: r.checkCancel}
	name := fmt.Sprintf("dama-task:%d", r.opts.ContextID)
	if mode == config.LockModeAdvisory {
		// One connection for everything: it holds the lock, so every new
		// one takes the lock again before anything else is sent on it.
		hooks = writerHooks{
			resume: func(ctx context.Context, conn *pgx.Conn) error {
				if err := r.lock.resume(ctx, conn); err != nil {
					return err
				}
				return r.checkCancel(ctx, conn)
			},
			lost: r.lock.lost,
		}
		name = r.lock.appName()
	}
	r.w = newWriter(r.opts.DatabaseURL, name, r.logger, stmtTimeout, hooks)
	r.w.runKey = r.opts.RunKey
	r.w.submit = r.opts.Submit
	// Probed like the lock connection, in both modes: the write connection
	// also hears cancellations, which a silently dead connection would lose.
	r.w.heartbeat = cfg.HeartbeatInterval
	r.lock.w = r.w
	wctx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	writerDone := make(chan struct{})
	startWriter := func(conn *pgx.Conn) {
		go func() {
			defer close(writerDone)
			r.w.run(wctx, conn, protocol.CancelChannel)
		}()
	}
	defer func() {
		stopWriter()
		if r.writerStarted {
			<-writerDone
		}
	}()
	if mode == config.LockModeRow {
		// The write connection is made while the lock is taken: it is
		// needed right after.
		r.writerStarted = true
		startWriter(nil)
	}

	c, conn, err := r.lock.lock(ctx)
	switch {
	case errors.Is(err, etlcontext.ErrLocked):
		r.logger.Info("another process holds the lock of this context")
		return protocol.ExitLocked, nil
	case errors.Is(err, etlcontext.ErrProtocolRefused):
		return protocol.ExitRefused, err
	case err != nil:
		return protocol.ExitSetup, err
	}
	if conn != nil {
		r.writerStarted = true
		startWriter(conn)
	}
	defer r.lock.release(ctx, stmtTimeout)
	if c.Status.Finished() {
		r.logger.Info("context already finished", "status", c.Status)
		return protocol.ExitFinished, nil
	}
	if c.Status != etlcontext.StatusRunning || c.RunID == nil || *c.RunID != r.opts.RunID || c.PID != nil {
		r.logger.Info("this run is not the context's current launch", "status", c.Status, "current_run_id", deref(c.RunID))
		return protocol.ExitLocked, nil
	}
	r.ctx = c
	r.w.bind(c.ID, r.opts.RunID, c.Kind)

	// What this host needs to run the task is checked before the runner
	// records itself: a launch that fails here is taken back by the
	// supervisor without spending an attempt.
	if err := r.prepare(); err != nil {
		fctx, cancel := context.WithTimeout(ctx, stmtTimeout)
		defer cancel()
		// Every launch on this host meets the same condition until it is
		// repaired: one WARNING per attempt says so. Cleaned first, so that
		// the stored reason compares equal.
		reason, _ := etlcontext.CleanText("this host cannot run the task: " + err.Error())
		var seen bool
		if serr := r.w.do(fctx, func(ctx context.Context, conn *pgx.Conn) (err error) {
			seen, err = etlcontext.WarnedThisAttempt(ctx, conn, c.ID, reason)
			return err
		}); serr != nil {
			r.logger.Warn("read earlier warnings", "error", serr)
		}
		if !seen {
			r.w.event(protocol.EventWarning, map[string]any{"reason": reason, "host": r.opts.Host}, map[string]any{etlcontext.UnfitHostMeta: reason}, false)
			if ferr := r.w.flush(fctx); ferr != nil {
				err = errors.Join(err, ferr)
			}
		}
		return protocol.ExitUnfit, err
	}
	defer r.logFile.Close()

	select {
	case sig := <-r.signals:
		// Nothing is recorded yet: the supervisor takes the launch back,
		// and no attempt is spent.
		r.logger.Info("signalled before the command started: the launch is given back", "signal", sig.String())
		return protocol.ExitSetup, nil
	default:
	}
	cancelRequested, err := r.recordStart(ctx)
	switch {
	case errors.Is(err, etlcontext.ErrStaleRun):
		return protocol.ExitLocked, nil
	case err != nil:
		return protocol.ExitSetup, err
	}
	select {
	case sig := <-r.signals:
		// Signalled while recording itself.
		return r.giveBack(ctx, sig)
	default:
	}
	if r.opts.Ready != nil {
		_, _ = r.opts.Ready.Write([]byte{1})
		r.opts.Ready.Close()
		r.opts.Ready = nil
	}
	if cancelRequested {
		// Cancelled between the launch and now: the command never starts.
		return r.finish(ctx, protocol.ExitCancelled, protocol.EventCancelled, map[string]any{"reason": "cancelled before the command started"}, nil)
	}
	return r.supervise(ctx)
}

// prepare checks that this host can run the task: the kind is configured,
// its command is found, and the log file can be opened.
func (r *runner) prepare() error {
	cfg := r.opts.Config
	kind, ok := cfg.Kind(r.ctx.Kind)
	if !ok {
		return fmt.Errorf("kind %s is not in the configuration %s", r.ctx.Kind, cfg.Path)
	}
	r.kind = kind
	if kind.Function != "" {
		if r.opts.Funcs[kind.Function] == nil {
			return fmt.Errorf("function %s of kind %s is not registered in this program (%s)", kind.Function, r.ctx.Kind, os.Args[0])
		}
		r.path, r.argv = selfExe, []string{os.Args[0], "dama-function", kind.Function}
	} else {
		path, err := exec.LookPath(kind.Command[0])
		if err != nil {
			return fmt.Errorf("find command of kind %s: %w", r.ctx.Kind, err)
		}
		r.path, r.argv = path, kind.Command
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return fmt.Errorf("create log directory: %w", err)
	}
	r.logPath = protocol.LogPath(cfg.LogDir, r.ctx.ID)
	f, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	r.logFile = f
	return nil
}

// recordStart records the runner's process on the context and reports
// whether the task was cancelled in the meantime; etlcontext.ErrStaleRun
// means the launch is no longer current.
func (r *runner) recordStart(ctx context.Context) (cancelRequested bool, err error) {
	cfg := r.opts.Config
	self, err := hostproc.Self()
	if err != nil {
		return false, fmt.Errorf("read own process: %w", err)
	}
	var started *time.Time
	if t, err := hostproc.StartTime(self.StartTicks); err == nil {
		started = &t
	}
	rec := etlcontext.Runner{
		Host: r.opts.Host, HostID: r.opts.HostID, PID: os.Getpid(), StartedAt: started,
		StartTicks: self.StartTicks, LogPath: r.logPath,
		FenceWindow: FenceWindow(cfg.HeartbeatInterval, *cfg.ReconnectGrace, *r.kind.KillGrace, cfg.PollInterval),
		LockMode:    string(r.lock.mode),
		Release:     version.Release,
		Protocol:    protocol.Version,
	}
	rctx, cancel := context.WithTimeout(ctx, 2*stmtTimeout)
	defer cancel()
	err = r.w.do(rctx, func(ctx context.Context, conn *pgx.Conn) error {
		// Read before recording: a database that fails now spends no
		// attempt (the supervisor takes back a launch with no task process
		// recorded).
		args, checkpoint, err := etlcontext.Payloads(ctx, conn, r.ctx.ID)
		if err != nil {
			return err
		}
		r.args, r.checkpoint = args, checkpoint
		cancelRequested, err = etlcontext.RecordRunner(ctx, conn, r.ctx.ID, r.opts.RunID, rec)
		return err
	})
	return cancelRequested, err
}

// giveBack ends a runner signalled after it recorded itself but before its
// command started: it withdraws its record, so that the supervisor takes
// the launch back without spending an attempt. When the database cannot be
// told, the attempt ends FAILED instead, by the kind's retry policy.
func (r *runner) giveBack(ctx context.Context, sig os.Signal) (int, error) {
	wctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	err := r.w.do(wctx, func(ctx context.Context, conn *pgx.Conn) error {
		return etlcontext.WithdrawRunner(ctx, conn, r.ctx.ID, r.opts.RunID, os.Getpid())
	})
	switch {
	case err == nil:
		r.logger.Info("signalled before the command started: the launch is given back", "signal", sig.String())
		return protocol.ExitSetup, nil
	case errors.Is(err, etlcontext.ErrStaleRun):
		return protocol.ExitLocked, nil
	}
	return r.finish(ctx, protocol.ExitFailed, protocol.EventError,
		map[string]any{"reason": "the task process received " + sig.String() + " before its command started"},
		fmt.Errorf("give the launch back: %w", err))
}

// supervise runs the command and reacts to its exit, to cancellation, to
// the loss of the lock and to signals sent to the runner. Nothing here waits
// on the database: writes are queued, the lock is watched by its keeper.
func (r *runner) supervise(ctx context.Context) (int, error) {
	cfg := r.opts.Config
	eventsR, eventsW, err := os.Pipe()
	if err != nil {
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, map[string]any{"reason": "create events pipe: " + err.Error()}, err)
	}
	defer eventsR.Close()
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
	// The lock is watched only from the command's start: make sure it is
	// still held right before, so the fencing window holds from the start.
	// A database restart since the lock was taken is ridden out here too:
	// nothing runs yet, so the runner may simply wait to take it again.
	if err := r.lock.check(ctx, *cfg.ReconnectGrace); err != nil {
		eventsW.Close()
		return r.finish(ctx, protocol.ExitLockLost, protocol.EventError, map[string]any{"reason": "the lock was lost before the command started and not taken again within reconnect_grace"}, fmt.Errorf("take the lock again before starting the command: %w", err))
	}
	select {
	case sig := <-r.signals:
		// Signalled while the lock was checked, which may wait out a
		// database restart: the command has not started yet.
		eventsW.Close()
		return r.giveBack(ctx, sig)
	default:
	}
	exited, err := startLocked(cmd)
	eventsW.Close()
	if err != nil {
		err = fmt.Errorf("start command of kind %s: %w", r.ctx.Kind, err)
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, map[string]any{"reason": err.Error()}, err)
	}
	pgid := cmd.Process.Pid
	var leaderTicks uint64
	if st, err := hostproc.ReadStat(pgid); err == nil {
		leaderTicks = st.StartTicks
	}
	r.w.call(func(ctx context.Context, conn *pgx.Conn) error {
		return etlcontext.RecordCommand(ctx, conn, r.ctx.ID, r.opts.RunID, pgid, leaderTicks)
	})
	r.logger.Info("command started", "pid", pgid, "command", r.argv, "attempt", r.ctx.Attempt)

	events := r.readEvents(ctx, eventsR)

	signals := r.signals
	superseded := r.w.superseded

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

	var (
		graceTimer <-chan time.Time
		lostSince  time.Time
		lockIsLost bool
		timeout    <-chan time.Time
		timedOut   bool
	)
	if d := r.kind.Timeout; d > 0 {
		timeout = time.After(d)
	}

	var (
		waitErr      error
		stopReason   string
		stopCode     int
		commandEnded bool
		ended        = make(chan struct{})
	)
	stop := func(reason string, code int) {
		if stopReason != "" {
			return
		}
		stopReason, stopCode = reason, code
		r.logger.Info("stopping command", "reason", reason)
		go killGroup(pgid, *r.kind.KillGrace, ended)
	}
	for !commandEnded {
		select {
		case waitErr = <-exited:
			commandEnded = true
		case n := <-r.w.notify:
			if n.Channel == protocol.CancelChannel && n.Payload == strconv.FormatInt(r.ctx.ID, 10) {
				stop("cancel requested", protocol.ExitCancelled)
			}
		case <-superseded:
			// Closed for good: heard once.
			superseded = nil
			stop("the database refused a write of this run: it is no longer current", protocol.ExitLockLost)
		case <-r.lock.changed:
			state, err := r.lock.get()
			switch {
			case state == lockLost && !lockIsLost:
				lockIsLost, lostSince = true, time.Now()
				grace := *cfg.ReconnectGrace
				r.logger.Error("lock connection failed; keeping the command running while taking the lock again", "error", err, "reconnect_grace", grace)
				if grace == 0 {
					stop("lock connection failed", protocol.ExitLockLost)
				} else {
					graceTimer = time.After(grace)
				}
			case state == lockHeld && lockIsLost:
				lockIsLost, graceTimer = false, nil
				r.logger.Info("lock held again", "unlocked_for", time.Since(lostSince).Round(time.Millisecond))
			case state == lockSuperseded:
				stop("the lock could not be taken again: "+err.Error(), protocol.ExitLockLost)
			}
		case <-timeout:
			timeout, timedOut = nil, true
			r.w.event(protocol.EventTimeout, map[string]any{
				"timeout": r.kind.Timeout.String(), "on_timeout": string(r.kind.OnTimeout), "kill_grace": (*r.kind.KillGrace).String(),
			}, nil, false)
			stop(fmt.Sprintf("timed out after %s", r.kind.Timeout), protocol.ExitFailed)
		case <-graceTimer:
			graceTimer = nil
			stop(fmt.Sprintf("the lock was not taken again within reconnect_grace (%s)", *cfg.ReconnectGrace), protocol.ExitLockLost)
		case sig := <-signals:
			stop("runner received "+sig.String(), protocol.ExitFailed)
		}
	}
	// Stragglers the command left behind end with it, in its group or not:
	// the next attempt must not meet them.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	// The group is empty now: a pending SIGKILL must not reach whoever
	// reuses its id.
	close(ended)
	r.stopDescendants(hostproc.Attempt{PGID: pgid, LeaderStartTicks: leaderTicks, Marker: protocol.RunIDEnv + "=" + r.opts.RunID})
	events.drain(ctx, *r.opts.Config.ReconnectGrace+stmtTimeout)
	stopWatch()
	<-watchDone

	exitCode := exitCodeOf(waitErr)
	switch {
	case stopCode == protocol.ExitLockLost:
		// Without the lock this process must not decide the outcome; the
		// database refuses the write anyway when another attempt started.
		return r.finish(ctx, protocol.ExitLockLost, protocol.EventError, map[string]any{"reason": stopReason, "exit_code": exitCode}, errors.New(stopReason))
	case stopCode == protocol.ExitCancelled:
		return r.finish(ctx, protocol.ExitCancelled, protocol.EventCancelled, map[string]any{"reason": stopReason, "exit_code": exitCode}, nil)
	case waitErr == nil && stopReason == "" && r.kind.AwaitChildren:
		return r.awaitChildren(ctx, signals)
	case waitErr == nil && stopReason == "":
		return r.finish(ctx, protocol.ExitDone, protocol.EventFinal, map[string]any{"exit_code": 0}, nil)
	default:
		reason := stopReason
		if reason == "" {
			reason = describeExit(waitErr)
		}
		logTail, replaced := tail(r.logPath, 4096)
		if replaced.Any() {
			r.w.replacedIn(protocol.EventError+" log tail", replaced)
		}
		payload := map[string]any{"reason": reason, "exit_code": exitCode, "log_tail": logTail}
		failure := r.lastFailure()
		if f := failure; stopReason == "" && f != nil {
			payload["reason"], payload["exit"] = f.Error, reason
		}
		switch {
		case timedOut:
			payload["timed_out"] = true
			if r.kind.OnTimeout == config.OnTimeoutFail {
				payload[etlcontext.ErrorFinal] = false
			}
		case stopReason == "" && failure != nil && failure.Retry != nil && !*failure.Retry,
			stopReason == "" && !r.kind.RetriesExit(exitCode):
			// The command said not to retry this failure.
			payload[etlcontext.ErrorFinal] = false
		}
		return r.finish(ctx, protocol.ExitFailed, protocol.EventError, payload, nil)
	}
}

// stopDescendants kills what remains of the attempt's processes and waits
// for them to be gone, however long that takes (a process in uninterruptible
// sleep dies late): the outcome is recorded, and the lock released, only
// once no process of the attempt is left to meet the next one.
func (r *runner) stopDescendants(a hostproc.Attempt) {
	nextReport := time.Now().Add(30 * time.Second)
	for {
		pids, err := a.Processes()
		if err == nil && len(pids) == 0 {
			return
		}
		if time.Now().After(nextReport) {
			r.logger.Error("processes of the command survive SIGKILL; waiting for them before recording the outcome", "pids", pids, "error", err)
			nextReport = time.Now().Add(30 * time.Second)
		}
		_ = a.Signal(syscall.SIGKILL)
		time.Sleep(50 * time.Millisecond)
	}
}

// finish records the attempt's outcome after everything queued before it,
// then releases the lock and announces the exit. While the database is
// away it waits up to reconnect_grace for it: the outcome of a command that
// ran for days is worth the wait. A runner that cannot record it leaves the
// context RUNNING with a free lock, and a supervisor records the attempt's
// death.
func (r *runner) finish(ctx context.Context, code int, suffix string, payload map[string]any, cause error) (int, error) {
	r.w.outcome(suffix, payload, plainOutcome(payload))
	wait := *r.opts.Config.ReconnectGrace + stmtTimeout
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
	if flushErr != nil {
		// The database is out of reach: nobody would hear the announcement.
		return code, cause
	}
	nctx, ncancel := context.WithTimeout(ctx, 2*time.Second)
	defer ncancel()
	if err := r.w.do(nctx, func(ctx context.Context, conn *pgx.Conn) error {
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

// eventsReader reads the command's events pipe and queues what it reports,
// blocking while the writer is at its bounds.
type eventsReader struct {
	r      *runner
	pipe   *os.File
	ctx    context.Context
	cancel context.CancelFunc
	done   chan error
	// lines counts the lines handed on; waiting is set while the reader
	// waits for room in the writer.
	lines   atomic.Int64
	waiting atomic.Bool
	// lost counts the lines not queued because the run ended first.
	lost atomic.Int64
	// read counts the bytes read from the pipe.
	read atomic.Int64
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
			if stopped != nil {
				// Why the command fails needs no room: it is never lost.
				if rep.failure != nil {
					r.setFailure(rep.failure)
					return
				}
				er.lost.Add(1)
				return
			}
			er.waiting.Store(true)
			stopped = r.report(er.ctx, rep)
			er.waiting.Store(false)
			if stopped != nil {
				er.lost.Add(1)
			}
		})
	}()
	return er
}

// report queues one line of the events pipe, waiting for room.
func (r *runner) report(ctx context.Context, rep reported) error {
	switch {
	case rep.failure != nil:
		r.setFailure(rep.failure)
		if rep.replaced.Any() {
			r.w.replacedIn(protocol.TypeFailure, rep.replaced)
		}
		return nil
	case rep.child != nil:
		if rep.replaced.Any() {
			r.w.replacedIn(protocol.TypeSubmit, rep.replaced)
		}
		return r.w.submitChild(ctx, *rep.child)
	}
	return r.w.report(ctx, rep.suffix, rep.payload, rep.meta, rep.isError, rep.replaced)
}

// drain waits until everything the command wrote is queued. Once its
// processes are gone the pipe ends, unless a process that escaped them
// holds it open: that is not waited for once the pipe has been quiet for
// 2 s. While the writer is behind, the wait goes on for as long as it
// makes progress, and for up to wait without any. Lines not stored are
// counted in a WARNING, queued ahead of the outcome.
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

func (r *runner) commandEnv(args, checkpoint json.RawMessage) []string {
	env := make([]string, 0, len(os.Environ())+9)
	for _, kv := range os.Environ() {
		// dama's credentials reach a command only when its kind asks.
		if name, _, _ := strings.Cut(kv, "="); config.Withheld(name) && (strings.HasPrefix(name, "DAMA_") || !slices.Contains(r.kind.PassEnv, name)) {
			continue
		}
		env = append(env, kv)
	}
	if len(args) == 0 {
		args = json.RawMessage("null")
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
// so that thread must live exactly as long as the command.
func startLocked(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
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

// killGroup sends SIGTERM to the process group, and SIGKILL after grace if
// the command has not ended by then.
func killGroup(pgid int, grace time.Duration, ended <-chan struct{}) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-timer.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	case <-ended:
	}
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
