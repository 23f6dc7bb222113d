// Package taskrunner is the detached process that runs one attempt of one
// task (`dama taskrunner`, started by the supervisor).
//
// On a connection of its own it opens a transaction, locks the context's
// INITIAL event row FOR UPDATE NOWAIT and takes an advisory lock keyed by the
// context id. It keeps that transaction open for as long as it lives: the lock
// is the proof that the task is running, and a second runner for the same
// context exits at once with ExitLocked. Every write goes over a second
// connection and carries the attempt's run id, which the database checks.
//
// The kind's command runs as the runner's child in its own process group,
// with its stdin on /dev/null, its output appended to the task's log file and
// a pipe on descriptor 3 for the events it reports. The command never
// outlives the runner (it gets SIGKILL when the runner dies) and never runs
// unlocked (when the lock connection fails the command's process group is
// stopped).
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
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shirou/gopsutil/v3/process"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// Exit codes of the runner process.
const (
	// ExitDone: the command exited 0 and the context is DONE.
	ExitDone = 0
	// ExitSetup: the runner could not run (bad arguments, unreachable
	// database); it wrote nothing.
	ExitSetup = 1
	// ExitLocked: another process holds the context's lock, or this run is
	// not the context's current launch; the runner wrote nothing.
	ExitLocked = 100
	// ExitFinished: the context is already finished; the runner wrote
	// nothing.
	ExitFinished = 101
	// ExitFailed: the command failed (non-zero exit, or it could not be
	// started); an ERROR event records why.
	ExitFailed = 102
	// ExitCancelled: the task was cancelled; a CANCELLED event records it.
	ExitCancelled = 103
	// ExitLockLost: the lock connection failed, so the command was stopped.
	ExitLockLost = 104
)

// CancelChannel is the NOTIFY channel on which `dama cancel` announces the id
// of a context to cancel.
const CancelChannel = "dama_cancel"

// ExitedChannel is the NOTIFY channel on which a runner announces, after it
// released its lock, the id of the context it ran, so that supervisors can
// settle the context's job at once.
const ExitedChannel = "dama_task_exited"

// Options configure one run.
type Options struct {
	// DatabaseURL names the database; it comes from the environment.
	DatabaseURL string
	// Config is the configuration the command of the task's kind is taken
	// from.
	Config *config.Config
	// ContextID is the context to run.
	ContextID int64
	// RunID is the run id the supervisor prepared for this launch.
	RunID string
	// Ready, when set, receives one byte once the runner holds the lock and
	// has recorded its process, and is then closed.
	Ready io.WriteCloser
	// Logger receives the runner's own log lines.
	Logger *slog.Logger
}

// Run runs the task and returns the process exit code.
func Run(ctx context.Context, opts Options) int {
	r := &runner{opts: opts, logger: opts.Logger.With("etl_context_id", opts.ContextID, "run_id", opts.RunID)}
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

	ctx     *etlcontext.Context
	kind    config.Kind
	logPath string
	db      *dbWorker
}

func (r *runner) run(ctx context.Context) (int, error) {
	cfg := r.opts.Config
	// The write connection and the process's start time are not needed
	// until the lock is held; getting them meanwhile shortens the launch.
	type workerResult struct {
		w   *dbWorker
		err error
	}
	workerCh := make(chan workerResult, 1)
	go func() {
		w, err := newDBWorker(ctx, r.opts.DatabaseURL, fmt.Sprintf("dama-task:%d", r.opts.ContextID), r.logger, CancelChannel)
		workerCh <- workerResult{w, err}
	}()
	startedCh := make(chan *time.Time, 1)
	go func() { startedCh <- processStartTime(ctx) }()
	gotWorker := false
	defer func() {
		if !gotWorker {
			// Leaving before the lock was held: the write connection was
			// never used.
			if res := <-workerCh; res.err == nil {
				res.w.conn.Close(context.WithoutCancel(ctx))
			}
		}
	}()

	lockConn, err := connect(ctx, r.opts.DatabaseURL, fmt.Sprintf("dama-task-lock:%d", r.opts.ContextID))
	if err != nil {
		return ExitSetup, fmt.Errorf("connect lock connection: %w", err)
	}
	defer lockConn.Close(context.WithoutCancel(ctx))

	tx, err := lockConn.Begin(ctx)
	if err != nil {
		return ExitSetup, fmt.Errorf("begin lock transaction: %w", err)
	}
	// The lock transaction stays idle for days: a server-wide idle timeout
	// would end it while the task runs on.
	if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = 0"); err != nil {
		return ExitSetup, fmt.Errorf("disable idle timeout of lock transaction: %w", err)
	}
	if serverMajor(lockConn) >= 17 {
		if _, err := tx.Exec(ctx, "SET LOCAL transaction_timeout = 0"); err != nil {
			return ExitSetup, fmt.Errorf("disable transaction timeout of lock transaction: %w", err)
		}
	}
	c, err := etlcontext.LockInitial(ctx, tx, r.opts.ContextID)
	switch {
	case errors.Is(err, etlcontext.ErrLocked):
		r.logger.Info("another process holds the lock of this context")
		return ExitLocked, nil
	case err != nil:
		return ExitSetup, err
	}
	if ok, err := etlcontext.TryAdvisoryLock(ctx, tx, c.ID); err != nil {
		return ExitSetup, err
	} else if !ok {
		r.logger.Info("another process holds the advisory lock of this context")
		return ExitLocked, nil
	}
	if c.Status.Finished() {
		r.logger.Info("context already finished", "status", c.Status)
		return ExitFinished, nil
	}
	if c.Status != etlcontext.StatusRunning || c.RunID == nil || *c.RunID != r.opts.RunID || c.PID != nil {
		r.logger.Info("this run is not the context's current launch", "status", c.Status, "current_run_id", deref(c.RunID))
		return ExitLocked, nil
	}
	r.ctx = c

	res := <-workerCh
	gotWorker = true
	if res.err != nil {
		return ExitSetup, res.err
	}
	r.db = res.w
	dbCtx, stopDB := context.WithCancel(context.WithoutCancel(ctx))
	dbDone := make(chan struct{})
	go func() {
		defer close(dbDone)
		r.db.run(dbCtx)
	}()
	defer func() {
		stopDB()
		<-dbDone
	}()

	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return r.fail(ctx, tx, fmt.Errorf("create log directory: %w", err))
	}
	r.logPath = filepath.Join(cfg.LogDir, strconv.FormatInt(c.ID, 10)+".log")
	cancelRequested, err := r.recordStart(ctx, <-startedCh)
	if err != nil {
		if errors.Is(err, errSuperseded) {
			return ExitLocked, nil
		}
		return ExitSetup, err
	}
	if r.opts.Ready != nil {
		_, _ = r.opts.Ready.Write([]byte{1})
		r.opts.Ready.Close()
		r.opts.Ready = nil
	}

	if cancelRequested {
		// Cancelled between the launch and now: the command never starts.
		if err := r.appendEvent(ctx, etlcontext.EventCancelled, map[string]any{"reason": "cancelled before the command started"}, nil); err != nil {
			return ExitCancelled, r.release(ctx, tx, err)
		}
		return ExitCancelled, r.release(ctx, tx, nil)
	}
	kind, ok := cfg.Kind(c.Kind)
	if !ok {
		return r.fail(ctx, tx, fmt.Errorf("kind %s is not in the configuration %s", c.Kind, cfg.Path))
	}
	r.kind = kind
	return r.supervise(ctx, tx)
}

var errSuperseded = errors.New("run superseded")

// serverMajor returns the server's major version, 0 when unknown.
func serverMajor(conn *pgx.Conn) int {
	v := conn.PgConn().ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// connect opens a connection named for pg_stat_activity, so that an operator
// can tell a task's lock connection from its write connection.
func connect(ctx context.Context, url, name string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = name
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	return conn, nil
}

// recordStart records the runner's process on the context, on the write
// connection, and reports whether the task was cancelled in the meantime; it
// fails with errSuperseded when the launch is no longer current.
func (r *runner) recordStart(ctx context.Context, started *time.Time) (cancelRequested bool, err error) {
	pid := os.Getpid()
	host, _ := os.Hostname()
	err = r.db.do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		err := conn.QueryRow(ctx, `
			UPDATE data_manager.etl_contexts
			   SET host = $3, pid = $4, process_started_at = $5, heartbeat_at = now(), log_path = $6
			 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = 'RUNNING' AND pid IS NULL
			RETURNING cancel_requested_at IS NOT NULL`,
			r.ctx.ID, r.opts.RunID, host, pid, started, r.logPath).Scan(&cancelRequested)
		if errors.Is(err, pgx.ErrNoRows) {
			return errSuperseded
		}
		if err != nil {
			return fmt.Errorf("record start of etl context %d: %w", r.ctx.ID, err)
		}
		return nil
	})
	return cancelRequested, err
}

// processStartTime returns this process's start time as the supervisor will
// read it (gopsutil, millisecond precision), or nil when unknown.
func processStartTime(ctx context.Context) *time.Time {
	p, err := process.NewProcessWithContext(ctx, int32(os.Getpid()))
	if err != nil {
		return nil
	}
	ms, err := p.CreateTimeWithContext(ctx)
	if err != nil {
		return nil
	}
	t := time.UnixMilli(ms)
	return &t
}

// supervise runs the command and reacts to its exit, to cancellation, to
// the loss of the lock connection and to signals sent to the runner.
func (r *runner) supervise(ctx context.Context, tx pgx.Tx) (int, error) {
	cfg := r.opts.Config
	logFile, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return r.fail(ctx, tx, fmt.Errorf("open log file: %w", err))
	}
	defer logFile.Close()

	var args, checkpoint json.RawMessage
	if err := r.db.do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		var err error
		if args, err = etlcontext.InitialPayload(ctx, conn, r.ctx.ID); err != nil {
			return err
		}
		checkpoint, err = etlcontext.LatestPayload(ctx, conn, r.ctx.ID, etlcontext.EventCheckpoint)
		return err
	}); err != nil {
		return r.fail(ctx, tx, err)
	}

	eventsR, eventsW, err := os.Pipe()
	if err != nil {
		return r.fail(ctx, tx, fmt.Errorf("create events pipe: %w", err))
	}
	defer eventsR.Close()

	path, err := exec.LookPath(r.kind.Command[0])
	if err != nil {
		eventsW.Close()
		return r.fail(ctx, tx, fmt.Errorf("find command of kind %s: %w", r.ctx.Kind, err))
	}
	cmd := &exec.Cmd{
		Path:       path,
		Args:       r.kind.Command,
		Env:        r.commandEnv(args, checkpoint),
		Stdout:     logFile,
		Stderr:     logFile,
		ExtraFiles: []*os.File{eventsW},
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
		},
	}
	exited, err := startLocked(cmd)
	eventsW.Close()
	if err != nil {
		return r.fail(ctx, tx, fmt.Errorf("start command of kind %s: %w", r.ctx.Kind, err))
	}
	pgid := cmd.Process.Pid
	r.logger.Info("command started", "pid", pgid, "command", r.kind.Command, "attempt", r.ctx.Attempt)

	lines := make(chan reported, 64)
	readerDone := make(chan error, 1)
	go func() {
		readerDone <- readEvents(eventsR, lines)
		close(lines)
	}()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(signals)

	lockLost := make(chan error, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchLock(watchCtx, tx, cfg.HeartbeatInterval.D(), lockLost)

	heartbeat := time.NewTicker(cfg.HeartbeatInterval.D())
	defer heartbeat.Stop()

	var (
		waitErr      error
		stopReason   string
		stopCode     int
		commandEnded bool
		ended        = make(chan struct{})
	)
	defer close(ended)
	stop := func(reason string, code int) {
		if stopReason != "" {
			return
		}
		stopReason, stopCode = reason, code
		r.logger.Info("stopping command", "reason", reason)
		go killGroup(pgid, cfg.KillGrace.D(), ended)
	}
	for !commandEnded {
		select {
		case line, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			r.store(ctx, line)
		case waitErr = <-exited:
			commandEnded = true
		case <-heartbeat.C:
			cancelled, err := r.heartbeat(ctx)
			switch {
			case errors.Is(err, errSuperseded):
				stop("the run is no longer current", ExitLockLost)
			case err != nil:
				r.logger.Warn("heartbeat", "error", err)
			case cancelled:
				stop("cancel requested", ExitCancelled)
			}
		case n := <-r.db.notify:
			if n.Channel == CancelChannel && n.Payload == strconv.FormatInt(r.ctx.ID, 10) {
				stop("cancel requested", ExitCancelled)
			}
		case err := <-lockLost:
			r.logger.Error("lock connection failed", "error", err)
			stop("lock connection failed", ExitLockLost)
		case sig := <-signals:
			stop("runner received "+sig.String(), ExitFailed)
		}
	}
	// Stragglers the command left in its group end with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	r.drain(ctx, lines, readerDone)
	stopWatch()

	exitCode := exitCodeOf(waitErr)
	switch {
	case stopCode == ExitLockLost:
		// Without the lock this process must not decide the outcome; the
		// database refuses the write anyway when another attempt has started.
		r.appendEvent(ctx, etlcontext.EventError, map[string]any{"reason": stopReason, "exit_code": exitCode}, nil)
		return ExitLockLost, errors.New(stopReason)
	case stopCode == ExitCancelled:
		if err := r.appendEvent(ctx, etlcontext.EventCancelled, map[string]any{"reason": stopReason, "exit_code": exitCode}, nil); err != nil {
			return ExitCancelled, r.release(ctx, tx, err)
		}
		return ExitCancelled, r.release(ctx, tx, nil)
	case waitErr == nil && stopReason == "":
		if err := r.appendEvent(ctx, etlcontext.EventFinal, map[string]any{"exit_code": 0}, nil); err != nil {
			return ExitFailed, r.release(ctx, tx, err)
		}
		return ExitDone, r.release(ctx, tx, nil)
	default:
		reason := stopReason
		if reason == "" {
			reason = describeExit(waitErr)
		}
		payload := map[string]any{"reason": reason, "exit_code": exitCode, "log_tail": tail(r.logPath, 4096)}
		if err := r.appendEvent(ctx, etlcontext.EventError, payload, nil); err != nil {
			return ExitFailed, r.release(ctx, tx, err)
		}
		return ExitFailed, r.release(ctx, tx, nil)
	}
}

// drain stores what the command wrote before it exited. A grandchild may hold
// the pipe open; it is not waited for long.
func (r *runner) drain(ctx context.Context, lines <-chan reported, readerDone <-chan error) {
	if lines == nil {
		return
	}
	timeout := time.After(2 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				if err := <-readerDone; err != nil {
					r.logger.Warn("read events", "error", err)
				}
				return
			}
			r.store(ctx, line)
		case <-timeout:
			r.logger.Warn("events pipe still open 2s after the command exited; later events are lost")
			return
		}
	}
}

func (r *runner) store(ctx context.Context, line reported) {
	var payload any
	if line.payload != nil {
		payload = line.payload
	}
	if err := r.appendEventFull(ctx, line.suffix, payload, line.meta, line.isError); err != nil {
		r.logger.Warn("store reported event", "type", line.suffix, "error", err)
	}
}

func (r *runner) appendEvent(ctx context.Context, suffix string, payload, meta any) error {
	return r.appendEventFull(ctx, suffix, payload, meta, false)
}

func (r *runner) appendEventFull(ctx context.Context, suffix string, payload, meta any, isError bool) error {
	runID := r.opts.RunID
	return r.db.do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := etlcontext.Append(ctx, conn, etlcontext.NewEvent{
			ContextID: r.ctx.ID,
			Type:      r.ctx.Kind + ":" + suffix,
			Payload:   payload,
			Meta:      meta,
			Error:     isError,
			RunID:     &runID,
		})
		return err
	})
}

// heartbeat records that the runner is alive and reports whether the task
// was asked to stop; errSuperseded means the run is no longer current.
func (r *runner) heartbeat(ctx context.Context) (cancelled bool, err error) {
	hbCtx, cancel := context.WithTimeout(ctx, r.opts.Config.HeartbeatInterval.D())
	defer cancel()
	err = r.db.do(hbCtx, func(ctx context.Context, conn *pgx.Conn) error {
		err := conn.QueryRow(ctx, `
			UPDATE data_manager.etl_contexts SET heartbeat_at = now()
			 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = 'RUNNING'
			RETURNING cancel_requested_at IS NOT NULL`, r.ctx.ID, r.opts.RunID).Scan(&cancelled)
		if errors.Is(err, pgx.ErrNoRows) {
			return errSuperseded
		}
		return err
	})
	return cancelled, err
}

// fail records an ERROR for a launch that could not start its command, then
// releases the lock.
func (r *runner) fail(ctx context.Context, tx pgx.Tx, cause error) (int, error) {
	if err := r.appendEvent(ctx, etlcontext.EventError, map[string]any{"reason": cause.Error()}, nil); err != nil {
		return ExitFailed, r.release(ctx, tx, errors.Join(cause, err))
	}
	return ExitFailed, r.release(ctx, tx, cause)
}

// release ends the lock transaction, waiting for the server to confirm, and
// only then announces the exit: a supervisor woken by the notification finds
// the lock free.
func (r *runner) release(ctx context.Context, tx pgx.Tx, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if err := tx.Rollback(ctx); err != nil {
		return errors.Join(cause, fmt.Errorf("end lock transaction: %w", err))
	}
	if err := r.db.do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", ExitedChannel, strconv.FormatInt(r.ctx.ID, 10))
		return err
	}); err != nil {
		r.logger.Warn("announce exit", "error", err)
	}
	return cause
}

func (r *runner) commandEnv(args, checkpoint json.RawMessage) []string {
	env := make([]string, 0, len(os.Environ())+5)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "DAMA_") {
			continue
		}
		env = append(env, kv)
	}
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	return append(env,
		"DAMA_ETL_CONTEXT_ID="+strconv.FormatInt(r.ctx.ID, 10),
		"DAMA_ATTEMPT="+strconv.Itoa(r.ctx.Attempt),
		"DAMA_ARGS="+string(args),
		"DAMA_CHECKPOINT="+string(checkpoint),
		"DAMA_EVENTS_FD=3",
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

// watchLock checks the lock connection at every interval and reports when it
// fails: the task must not run on without its lock.
func watchLock(ctx context.Context, tx pgx.Tx, interval time.Duration, lost chan<- error) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		pingCtx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		_, err := tx.Exec(pingCtx, "SELECT 1")
		cancel()
		if err != nil && ctx.Err() == nil {
			lost <- err
			return
		}
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
// line boundary.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(info.Size()-n, 0)
	buf := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	s := string(buf)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
