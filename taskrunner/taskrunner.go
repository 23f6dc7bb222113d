package taskrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/logdir"
	"github.com/dama-etl/dama/internal/runas"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/version"
)

// Options configure one run.
type Options struct {
	// DatabaseURL names the database; it comes from the secrets socket
	// (protocol.Secrets), or the environment of a runner started by hand.
	DatabaseURL string
	// Config is the configuration the command of the task's kind is taken
	// from; Run gives it its defaults (config.Config.WithDefaults).
	Config *config.Config
	// ContextID is the context to run.
	ContextID int64
	// RunID is the run id the supervisor prepared for this launch.
	RunID string
	// RunKey is the run's key the supervisor prepared (protocol.Secrets):
	// each of the runner's sessions holds it, which opens the run's rows
	// to a member of dama_task. Empty sets none.
	RunKey string
	// KeeperSecret is what the task processes of the supervisor that
	// started this one and their host's lock keeper prove to each other
	// (protocol.Secrets.Keeper); lock_mode host needs it.
	KeeperSecret []byte
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
	// Starter, when set, starts the command elsewhere than as the
	// runner's child. Such a runner is not its supervisor's child either:
	// its log directory is a volume of its own, whose owner and mode are
	// not dama's, and its stderr is not the task's log file (a
	// container's log), which gets its lines too.
	Starter Starter
	// CgroupParent, when set, is the control group under which the
	// command and every process it starts get a group of their own, named
	// by RunID and bounded by the kind's resources: the kernel then keeps
	// the attempt's processes together, whatever session they move to,
	// and counts what they cost (protocol.Launch.CgroupParent).
	CgroupParent string
	// ownLog is what Logger writes through (set by RunFromArgs): the
	// runner's own lines in the task's log, which are not its command's
	// output to a stall watch. nil counts none.
	ownLog *ownLog
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
	// This process holds the database URL and the run's key: a process
	// of the same user (the command, unless its kind names another user)
	// must not read its memory or trace it. The command itself is
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
	if err := hostproc.BecomeSubreaper(); err != nil {
		r.logger.Warn("the command's processes will be found by reading every process of the host", "error", err)
	} else {
		r.subreaper = true
	}
	code, err := r.run(ctx)
	if err != nil {
		r.logger.Error("the task process ends on an error", "error", err, "exit_code", code)
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
	// runAs is the user the command runs as (the kind's user), nil for
	// this process's own.
	runAs *runas.Identity
	// failure is what the command said, last, of why it fails; set by the
	// events reader, guarded by failureMu.
	failure   *protocol.Failure
	failureMu sync.Mutex
	// logs is the log directory, logFile the attempt's log, open to append;
	// the command's output starts at outputFrom, its size then.
	logs       *logdir.Dir
	logPath    string
	logFile    *os.File
	outputFrom int64
	// args and checkpoint are handed to the command.
	args, checkpoint json.RawMessage
	w                *writer
	writerStarted    bool
	lock             *lockKeeper
	// subreaper: the runner is its command's subreaper, and finds the
	// attempt's processes in its own tree (reap.go).
	subreaper bool
	// usage is what the command's processes cost, read from their
	// control group once they are gone; nil without one.
	usage *protocol.Usage
	// keepers are the lock keepers the runner started: its children, but
	// not its command's processes, left running when it ends.
	keepersMu sync.Mutex
	keepers   map[process]bool
}

// checkCancel runs first on every new write connection but the first: a
// cancellation announced while the runner was away from the database is
// delivered as if heard. It fails with etlcontext.ErrStaleRun when the run
// is no longer current.
func (r *runner) checkCancel(ctx context.Context, conn dbConn) error {
	requested, err := etlcontext.CancelRequested(ctx, conn, r.opts.ContextID, r.opts.RunID)
	if err != nil || !requested {
		return err
	}
	// Run on the writer's goroutine: the writer passes it on.
	r.w.cancelHinted = true
	return nil
}

func (r *runner) run(ctx context.Context) (int, error) {
	if s := r.opts.Starter; s != nil && !s.Attach(r.opts, r.logger, r.signals) {
		return protocol.ExitSetup, nil
	}
	mode := r.opts.LockMode
	if mode == "" {
		mode = config.LockModeRow
	}
	r.connections(mode)
	wctx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	writerDone := make(chan struct{})
	startWriter := func(conn dbConn) {
		r.writerStarted = true
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
		startWriter(nil)
	}

	c, conn, err := r.lock.lock(ctx)
	for errors.Is(err, etlcontext.ErrLocked) && r.opts.Starter != nil && r.opts.Starter.RetryLock() {
		c, conn, err = r.lock.lock(ctx)
	}
	switch {
	case errors.Is(err, etlcontext.ErrLocked):
		r.logger.Info("another process holds the lock of this task; this launch ends")
		return protocol.ExitLocked, nil
	case errors.Is(err, etlcontext.ErrStaleRun):
		// The lock keeper does not take the run's key.
		r.logger.Info("this launch is no longer the task's current one; it ends", "error", err)
		return protocol.ExitLocked, nil
	case errors.Is(err, etlcontext.ErrProtocolRefused):
		return protocol.ExitRefused, err
	case err != nil:
		return protocol.ExitSetup, err
	}
	if conn != nil {
		startWriter(conn)
	}
	defer r.lock.release(ctx, stmtTimeout, false)
	if c.Status.Finished() {
		r.logger.Info("the task is already finished; this launch ends", "status", c.Status)
		return protocol.ExitFinished, nil
	}
	if c.Status != etlcontext.StatusRunning || c.RunID == nil || *c.RunID != r.opts.RunID || c.PID != nil {
		r.logger.Info("this launch is no longer the task's current one; it ends", "status", c.Status, "current_run_id", deref(c.RunID))
		return protocol.ExitLocked, nil
	}
	r.ctx = c
	r.w.bind(c.ID, r.opts.RunID, c.Kind)

	// What this host needs to run the task is checked before the runner
	// records itself: a launch that fails here is taken back by the
	// supervisor without spending an attempt.
	if err := r.prepare(); err != nil {
		return r.unfit(ctx, err)
	}
	defer r.logs.Close()
	defer r.logFile.Close()
	return r.start(ctx)
}

// connections sets up the lock (r.lock) and the writes (r.w) for mode.
// In row mode they are two
// connections; otherwise one, which holds the lock, so that every new one
// takes the lock again before anything else is sent on it. In host mode
// it is a session with the keeper, which holds the lock for as long as
// the session lasts.
func (r *runner) connections(mode config.LockMode) {
	heartbeat := time.Duration(r.opts.Config.HeartbeatInterval)
	r.lock = newLockKeeper(r.opts.DatabaseURL, r.opts.ContextID, r.opts.RunID, mode, heartbeat, r.logger)
	r.lock.runKey = r.opts.RunKey
	hooks := writerHooks{resume: r.checkCancel}
	name := fmt.Sprintf("dama-task:%d", r.opts.ContextID)
	if mode != config.LockModeRow {
		hooks = writerHooks{
			resume: func(ctx context.Context, conn dbConn) error {
				if err := r.lock.resume(ctx, conn); err != nil {
					return err
				}
				return r.checkCancel(ctx, conn)
			},
			lost: r.lock.lost,
		}
		name = r.lock.appName()
		r.lock.dial = func(ctx context.Context) (dbConn, error) {
			conn, err := connect(ctx, r.opts.DatabaseURL, r.opts.RunKey, name, heartbeat)
			if err != nil {
				return nil, err
			}
			return pgxConn{conn}, nil
		}
		if mode == config.LockModeHost {
			r.lock.dial = r.dialKeeper
		}
	}
	r.w = newWriter(r.opts.DatabaseURL, name, r.logger, stmtTimeout, hooks)
	r.w.outage.grace = time.Duration(*r.opts.Config.ReconnectGrace)
	r.w.dial = r.lock.dial
	r.w.runKey = r.opts.RunKey
	r.w.submit = r.opts.Submit
	// Probed like the lock connection, in both modes: the write connection
	// also hears cancellations, which a silently dead connection would lose.
	r.w.heartbeat = heartbeat
	r.w.sampleEvery = time.Duration(r.opts.Config.ProgressInterval)
	r.lock.w = r.w
}

// unfit ends a launch this host cannot run (err, from prepare): the
// supervisor takes it back without spending an attempt. Every launch on
// this host meets the same condition until it is repaired: one WARNING
// per attempt says so.
func (r *runner) unfit(ctx context.Context, err error) (int, error) {
	fctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	// Cleaned first, so that the stored reason compares equal.
	reason, _ := etlcontext.CleanText(etlcontext.UnfitPrefix + err.Error())
	var seen bool
	if serr := r.w.do(fctx, func(ctx context.Context, conn dbConn) (err error) {
		seen, err = etlcontext.WarnedThisAttempt(ctx, conn, r.ctx.ID, reason)
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

// start records the attempt's start and tells the supervisor, then runs
// the command, unless a signal or a cancellation came first.
func (r *runner) start(ctx context.Context) (int, error) {
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
		// The record's outcome is unknown: it may have committed after
		// its reply was lost or its time ran out.
		return r.unrecord(ctx, err)
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
		return r.finish(ctx, protocol.ExitCancelled, protocol.EventCancelled, protocol.Outcome{Reason: "cancelled before the command started"}, nil)
	}
	return r.supervise(ctx)
}

// prepare checks that this host can run the task: the kind is configured,
// its command is found, its user may run it, and the log file can be
// opened.
func (r *runner) prepare() error {
	cfg := r.opts.Config
	kind, ok := cfg.Kind(r.ctx.Kind)
	if !ok {
		return fmt.Errorf("kind %s is not in the configuration %s", r.ctx.Kind, cfg.Path)
	}
	r.kind = kind
	// Its command, which may run as another user than a child's kind,
	// chooses a child's arguments: only the kinds it names are submitted.
	// The database checks it too, for whatever else writes through this
	// login. Set before the command starts, whose lines alone submit.
	if submit := r.w.submit; submit != nil {
		r.w.submit = func(ctx context.Context, tx pgx.Tx, c protocol.Child) (int64, bool, error) {
			if !slices.Contains(kind.Children, c.Kind) {
				return 0, false, fmt.Errorf("kind %s may not submit kind %s: its children: are %v", r.ctx.Kind, c.Kind, kind.Children)
			}
			return submit(ctx, tx, c)
		}
	}
	switch {
	case r.opts.Starter != nil:
		path, err := r.opts.Starter.Find(r.ctx.Kind, kind)
		if err != nil {
			return err
		}
		r.path, r.argv = path, kind.Command
	case kind.Function != "":
		if r.opts.Funcs[kind.Function] == nil {
			return fmt.Errorf("function %s of kind %s is not registered in this program (%s)", kind.Function, r.ctx.Kind, os.Args[0])
		}
		// Its task named in a process listing, as its runner's is; the
		// function process reads its task from its environment.
		r.path, r.argv = selfExe, []string{os.Args[0], "dama-function", kind.Function, "--context-id", strconv.FormatInt(r.ctx.ID, 10)}
	default:
		path, err := kind.FindCommand()
		if err != nil {
			return err
		}
		r.path, r.argv = path, kind.Command
	}
	// The configuration may have changed since the supervisor checked it.
	// A Starter's command runs as the user of wherever it runs (a pod's
	// container's).
	var (
		id  *runas.Identity
		err error
	)
	if r.opts.Starter == nil {
		id, err = runas.Resolve(kind.User, kind.Group)
	}
	if errors.Is(err, runas.ErrRootByDefault) && r.opts.RunKey == "" {
		// Launched by a supervisor of a release before user: (it gives no
		// run key), whose configuration cannot name one: as it ran the
		// command.
		r.logger.Warn("running the command as root, as the supervisor that launched this task process did: give the kind a user once every supervisor is of this release", "kind", r.ctx.Kind)
		err = nil
	}
	if err == nil && id != nil {
		err = id.Check(cfg.LogDir)
	}
	if err == nil && id != nil && kind.Function == "" {
		err = id.CanRun(r.path)
	}
	if err != nil {
		return fmt.Errorf("kind %s: %w", r.ctx.Kind, err)
	}
	r.runAs = id
	if r.logs, err = openLogs(cfg, r.opts.Starter != nil); err != nil {
		return err
	}
	r.logPath = r.logs.Path(r.ctx.ID)
	if r.logFile, err = r.logs.Append(r.ctx.ID); err != nil {
		r.logs.Close()
		return err
	}
	// Without the tail in the database, the file still has the log: a
	// host that cannot read what it writes runs the task all the same.
	tail, err := r.openLogTail(cfg.LogTailBytes, time.Duration(cfg.LogTailInterval))
	if err != nil {
		r.logger.Warn("the database keeps no tail of this attempt's log", "error", err)
	}
	r.w.keepTail(tail)
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
		FenceWindow: FenceWindow(time.Duration(cfg.HeartbeatInterval), time.Duration(*cfg.ReconnectGrace), time.Duration(*r.kind.KillGrace), time.Duration(cfg.PollInterval)),
		LockMode:    string(r.lock.mode),
		Release:     version.Release,
		Protocol:    protocol.Version,
	}
	rctx, cancel := context.WithTimeout(ctx, 2*stmtTimeout)
	defer cancel()
	err = r.w.do(rctx, func(ctx context.Context, conn dbConn) error {
		got, err := etlcontext.RecordRunner(ctx, conn, r.ctx.ID, r.opts.RunID, rec)
		r.args, r.checkpoint, cancelRequested = got.Args, got.Checkpoint, got.CancelRequested
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
	err := r.w.do(wctx, func(ctx context.Context, conn dbConn) error {
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
		protocol.Outcome{Reason: "the task process received " + sig.String() + " before its command started"},
		fmt.Errorf("give the launch back: %w", err))
}

// unrecord ends a runner whose record of itself failed with err, an outcome
// it cannot know (a statement timed out or its connection was lost: the
// server may have committed it all the same, or may still be running it).
// The command never starts: the runner ends its writer's other sessions,
// so that no statement of theirs commits later, then withdraws whatever
// was recorded under its run, so that the supervisor finds no task process
// and takes the launch back without spending an attempt (ExitSetup), as it
// does for every other setup failure. When the database cannot be told,
// the record may stand: the supervisor then counts the attempt dead, as
// for a runner killed at this point.
func (r *runner) unrecord(ctx context.Context, err error) (int, error) {
	wctx, cancel := context.WithTimeout(ctx, 2*stmtTimeout)
	defer cancel()
	werr := r.w.do(wctx, func(ctx context.Context, conn dbConn) error {
		if r.lock.mode != config.LockModeHost {
			if err := endOtherSessions(ctx, conn, r.w.name); err != nil {
				return err
			}
		}
		return etlcontext.WithdrawRunner(ctx, conn, r.ctx.ID, r.opts.RunID, os.Getpid())
	})
	switch {
	case werr == nil:
		r.logger.Info("recording the task process failed; anything recorded is withdrawn and the launch given back", "error", err)
		return protocol.ExitSetup, err
	case errors.Is(werr, etlcontext.ErrStaleRun):
		return protocol.ExitLocked, err
	}
	return protocol.ExitSetup, errors.Join(err, fmt.Errorf("withdraw the task process: %w", werr))
}

// endOtherSessions ends the sessions named name but conn's, and returns
// once they are gone: a statement whose reply a lost connection never
// brought may still be running in one of them.
func endOtherSessions(ctx context.Context, conn etlcontext.DB, name string) error {
	const others = `FROM pg_stat_activity
		 WHERE application_name = $1 AND pid <> pg_backend_pid() AND datname = current_database()`
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) `+others, name); err != nil {
		return fmt.Errorf("end the task process's other sessions: %w", err)
	}
	for {
		var left bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT `+others+`)`, name).Scan(&left); err != nil {
			return fmt.Errorf("end the task process's other sessions: %w", err)
		}
		if !left {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("end the task process's other sessions: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
