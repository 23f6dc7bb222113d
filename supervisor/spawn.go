package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/taskrunner"
)

type launchOutcome int

// lateReadyWait bounds how long a supervisor listens for the report of a
// runner that did not report within the launch timeout: the runner holds
// its lock by then, or has failed to for good.
const lateReadyWait = 10 * time.Minute

const (
	// launchReady: the runner holds the lock and runs the command.
	launchReady launchOutcome = iota
	// launchPending: the runner did not report within the launch timeout; it
	// may still take its lock.
	launchPending
	// launchLocked: the runner found another process holding the lock.
	launchLocked
	// launchExited: the runner exited before holding its lock.
	launchExited
	// launchRefused: the database no longer accepts this release's task
	// processes (taskrunner.ExitRefused).
	launchRefused
)

// child is a runner this supervisor spawned and reaps.
type child struct {
	pid      int
	exited   chan struct{}
	exitCode int
}

// launch spawns `dama taskrunner` for c, detached: in a session of its own
// (so no signal for the supervisor's process group reaches it), stdio on
// /dev/null and the task's log file, no inherited descriptor but the
// readiness pipe, and the database URL in its environment rather than its
// arguments. It waits, at most LaunchTimeout, for the runner to report that
// it holds the lock, or to exit. A runner that reports later (the outcome
// is then launchPending) makes it call lateReady, if that is within
// lateReadyWait.
func (s *Supervisor) launch(ctx context.Context, logger *slog.Logger, c *etlcontext.Context, run etlcontext.Run, lateReady func()) (launchOutcome, error) {
	if err := os.MkdirAll(s.cfg.LogDir, 0o755); err != nil {
		return 0, fmt.Errorf("create log directory: %w", err)
	}
	logPath := filepath.Join(s.cfg.LogDir, strconv.FormatInt(c.ID, 10)+".log")
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, fmt.Errorf("open log file: %w", err)
	}
	defer logFile.Close()
	// The run's key goes through a pipe, written whole before the runner
	// starts (it is far shorter than a pipe's buffer).
	keyR, keyW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("create key pipe: %w", err)
	}
	defer keyR.Close()
	_, err = io.WriteString(keyW, run.Key)
	if cerr := keyW.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("write the run's key: %w", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("create readiness pipe: %w", err)
	}
	defer func() {
		if readyR != nil {
			readyR.Close()
		}
	}()
	// pending hands the open pipe to a goroutine that hears a late report.
	pending := func(logger *slog.Logger, pid int) (launchOutcome, error) {
		r, since := readyR, time.Now()
		readyR = nil
		go func() {
			defer r.Close()
			_ = r.SetReadDeadline(time.Now().Add(lateReadyWait))
			var b [1]byte
			if n, _ := r.Read(b[:]); n == 1 {
				logger.Info("task process took its lock after the launch timeout", "pid", pid, "later_by", time.Since(since))
				lateReady()
			}
		}()
		return launchPending, nil
	}

	kind, _ := s.cfg.Kind(c.Kind)
	launch := taskrunner.Launch{ContextID: c.ID, RunID: run.ID, LockMode: s.cfg.LockModeOf(kind), ReadyFD: 3, KeyFD: 4}
	cmd := exec.Command(s.spawnPath, launch.Args()...)
	// Named by its path in a process listing, whichever file it runs from.
	cmd.Args[0] = s.opts.Executable
	cmd.Env = runnerEnv(s.opts.DatabaseURL, s.cfg.Path)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.ExtraFiles = []*os.File{readyW, keyR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		readyW.Close()
		return 0, fmt.Errorf("start taskrunner: %w", err)
	}
	readyW.Close()
	keyR.Close() // the runner has its own
	ch := &child{pid: cmd.Process.Pid, exited: make(chan struct{})}
	s.mu.Lock()
	s.children[c.ID] = ch
	s.mu.Unlock()
	go s.reap(c.ID, cmd, ch)
	logger.Info("spawned task process", "pid", ch.pid, "kind", c.Kind)

	_ = readyR.SetReadDeadline(time.Now().Add(s.opts.LaunchTimeout))
	var b [1]byte
	n, err := readyR.Read(b[:])
	switch {
	case n == 1:
		return launchReady, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		logger.Warn("task process has not taken its lock yet", "pid", ch.pid, "waited", s.opts.LaunchTimeout)
		return pending(logger, ch.pid)
	}
	// The pipe closed without a byte: the runner is exiting, and will not
	// report.
	select {
	case <-ch.exited:
	case <-time.After(s.opts.LaunchTimeout):
		return launchPending, nil
	case <-ctx.Done():
		return launchPending, nil
	}
	switch ch.exitCode {
	case taskrunner.ExitLocked:
		return launchLocked, nil
	case taskrunner.ExitRefused:
		return launchRefused, nil
	}
	logger.Warn("task process exited before taking its lock", "pid", ch.pid, "exit_code", ch.exitCode, "log", logPath)
	return launchExited, nil
}

// runnerEnv is the supervisor's environment with the database URL and the
// configuration path set, for the runner to read, and the process it is
// to be, for a program embedding the supervisor.
func runnerEnv(databaseURL, configPath string) []string {
	env := make([]string, 0, len(os.Environ())+3)
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case taskrunner.DatabaseURLEnv, taskrunner.ConfigEnv, taskrunner.ProcessEnv, taskrunner.FunctionEnv:
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		taskrunner.DatabaseURLEnv+"="+databaseURL,
		taskrunner.ConfigEnv+"="+configPath,
		taskrunner.ProcessEnv+"="+taskrunner.ProcessRunner)
}

// reap waits for a spawned runner so that it does not linger as a zombie,
// then wakes its context's job so the outcome is settled at once rather than
// a poll interval later.
func (s *Supervisor) reap(id int64, cmd *exec.Cmd, ch *child) {
	err := cmd.Wait()
	ch.exitCode = 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		ch.exitCode = exitErr.ExitCode()
	} else if err != nil {
		ch.exitCode = -1
	}
	close(ch.exited)
	s.mu.Lock()
	if s.children[id] == ch {
		delete(s.children, id)
	}
	s.mu.Unlock()
	s.logger.Info("task process exited", "etl_context_id", id, "pid", ch.pid, "exit_code", ch.exitCode)
	if ch.exitCode == taskrunner.ExitRefused {
		// Also when the refusal came after the launch stopped waiting.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.retire(ctx)
		cancel()
	}
	if ch.exitCode != taskrunner.ExitLocked {
		s.wake(context.Background(), id)
	}
}

// wake makes the snoozed job of context id available now, so that a step
// settles the context without waiting out the job's snooze. Steps are
// idempotent, so an extra one is harmless; a job in the middle of a step is
// left alone and looked at again shortly.
func (s *Supervisor) wake(ctx context.Context, id int64) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		var (
			state rivertype.JobState
			queue string
			woken bool
		)
		// The outer select sees the job as it was before the wake.
		err := s.pool.QueryRow(ctx, `
			WITH due AS (
				-- An announcement is a hint that anyone may send: a task
				-- that is not due yet (--delay, --run-at) is not woken, for
				-- its step would only park it again.
				SELECT river_job_id AS id FROM data_manager.etl_contexts
				 WHERE etl_context_id = $1 AND coalesce(due_at, created_at) <= now()),
			woken AS (`+wakeSQL+`)
			SELECT j.state, j.queue, EXISTS (SELECT 1 FROM woken)
			  FROM river_job AS j JOIN due ON j.id = due.id`, id).Scan(&state, &queue, &woken)
		if errors.Is(err, pgx.ErrNoRows) {
			return
		}
		if err != nil {
			s.logger.Warn("wake job", "etl_context_id", id, "error", err)
			return
		}
		switch {
		case woken:
			s.notifyQueue(ctx, queue)
			s.wakeWaiting(context.WithoutCancel(ctx), queue)
			return
		case state == rivertype.JobStateRunning:
			// A step is under way; it may snooze the job without having seen
			// the exit, so look again shortly.
		default:
			// Already due, in backoff, or finished: nothing to wake but the
			// tasks waiting for the slot this one freed.
			s.wakeWaiting(context.WithoutCancel(ctx), queue)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// listener is the supervisor's connection that hears runners announce their
// exit. It holds no lock: the liveness lock has a connection of its own
// (holdLiveness), so that the listener can fail and reconnect without anyone
// taking the supervisor for dead.
type listener struct {
	conn *pgx.Conn
}

func (s *Supervisor) connectListener(ctx context.Context) (*listener, error) {
	conn, err := s.connectNamed(ctx, listenAppNamePrefix+s.river.ID())
	if err != nil {
		return nil, fmt.Errorf("open listening connection: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+taskrunner.ExitedChannel+"; LISTEN "+etlcontext.ControlChannel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen for task exits: %w", err)
	}
	return &listener{conn: conn}, nil
}

// wakeTimeout bounds a wake-up of waiting tasks.
const wakeTimeout = 10 * time.Second

// wakeWaiting wakes the parked jobs of the queue's due tasks that wait for
// a slot and would find one now, as many as the queue has free slots, the
// kinds taking turns (etlcontext.WakeWaiting), so that a slot freed by a
// task's end, a resumed queue or an unblocked kind is taken at once. It is
// also the backstop, every poll interval, for a wake-up that came while the
// task's step was still parking it. A woken task that finds no slot after
// all (another supervisor's start took it) is parked again.
//
// Wake-ups of one queue are coalesced: while one runs, those asked for
// meanwhile (500 tasks ending at once) make it run once more, not 500
// times at once.
func (s *Supervisor) wakeWaiting(ctx context.Context, queue string) {
	s.mu.Lock()
	if again, running := s.waking[queue]; running {
		if !again {
			s.waking[queue] = true
		}
		s.mu.Unlock()
		return
	}
	s.waking[queue] = false
	s.mu.Unlock()
	for {
		s.wakeOnce(ctx, queue)
		s.mu.Lock()
		if !s.waking[queue] {
			delete(s.waking, queue)
			s.mu.Unlock()
			return
		}
		s.waking[queue] = false
		s.mu.Unlock()
	}
}

// wakeOnce is one wake-up of the queue's waiting tasks.
func (s *Supervisor) wakeOnce(ctx context.Context, queue string) {
	q, ok := s.cfg.Queues[queue]
	if !ok {
		return
	}
	var (
		kinds         = s.cfg.KindNames()
		maxes, keyMax = make([]int32, len(kinds)), make([]int32, len(kinds))
	)
	for i, name := range kinds {
		k, _ := s.cfg.Kind(name)
		maxes[i], keyMax[i] = int32(k.MaxRunning), int32(k.MaxRunningPerKey)
	}
	ctx, cancel := context.WithTimeout(ctx, wakeTimeout)
	defer cancel()
	var n int
	err := s.pool.QueryRow(ctx, `
		WITH due AS (`+etlcontext.WakeWaiting+`),
		woken AS (`+wakeSQL+`)
		SELECT count(*) FROM woken`, queue, q.MaxRunning, kinds, maxes, keyMax).Scan(&n)
	if err != nil {
		// The backstop tries again at the next poll interval.
		if !errors.Is(err, context.Canceled) {
			s.logger.Warn("wake tasks waiting for a slot", "queue", queue, "error", err)
		}
		return
	}
	if n > 0 {
		s.notifyQueue(ctx, queue)
	}
}

// reconcile repairs the disagreements a step cannot see, because no step
// runs once a job is finished: a context that is not finished while its River
// job is, or a finished context whose job ended in a state that says
// otherwise. They happen only behind dama's back (River's own rescuer after
// all supervisors were down for an hour, a job cancelled or deleted by hand);
// the job is retried, or a new one enqueued, and the next step settles the
// context like any other.
func (s *Supervisor) reconcile(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `
		SELECT c.etl_context_id, c.queue, c.kind, c.max_attempts, j.id
		  FROM data_manager.etl_contexts AS c
		  LEFT JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_status NOT IN ('DONE', 'FAILED', 'CANCELLED')
		   AND c.queue = ANY($1)
		   AND (j.id IS NULL OR j.state IN ('completed', 'cancelled', 'discarded'))
		UNION ALL
		-- Finished contexts are many; only recently finalized jobs can
		-- disagree with theirs (River deletes old finalized jobs anyway).
		SELECT c.etl_context_id, c.queue, c.kind, c.max_attempts, j.id
		  FROM river_job AS j
		  JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
		 WHERE j.state IN ('completed', 'cancelled', 'discarded')
		   AND j.finalized_at > now() - interval '1 day'
		   AND c.queue = ANY($1)
		   AND CASE c.etl_status
		         WHEN 'DONE' THEN j.state <> 'completed'
		         WHEN 'CANCELLED' THEN j.state <> 'cancelled'
		         -- A FAILED context's job is discarded, or cancelled when it
		         -- was retried after the context had failed.
		         WHEN 'FAILED' THEN j.state = 'completed'
		         ELSE false
		       END`, s.cfg.QueueNames())
	if err != nil {
		return fmt.Errorf("find contexts that disagree with their jobs: %w", err)
	}
	type orphan struct {
		id, job     int64
		queue, kind string
		maxAttempts int
		hasJob      bool
	}
	orphans, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (orphan, error) {
		var (
			o   orphan
			job *int64
		)
		err := row.Scan(&o.id, &o.queue, &o.kind, &o.maxAttempts, &job)
		if job != nil {
			o.job, o.hasJob = *job, true
		}
		return o, err
	})
	if err != nil {
		return fmt.Errorf("find unsettled contexts: %w", err)
	}
	for _, o := range orphans {
		if o.hasJob {
			if _, err := s.river.JobRetry(ctx, o.job); err != nil {
				return fmt.Errorf("retry job %d of unsettled etl context %d: %w", o.job, o.id, err)
			}
			s.logger.Warn("retried a job whose state disagreed with its context", "etl_context_id", o.id, "job_id", o.job)
		} else {
			// Retrying a job twice is harmless, inserting two is not: a
			// context must have exactly one job.
			jobID, err := s.enqueueMissingJob(ctx, o.id, o.queue, o.kind, o.maxAttempts)
			if err != nil {
				return fmt.Errorf("enqueue a job for unsettled etl context %d: %w", o.id, err)
			}
			if jobID == 0 {
				// Another supervisor's reconcile enqueued one first.
				continue
			}
			s.logger.Warn("enqueued a new job for a context whose job was gone", "etl_context_id", o.id, "job_id", jobID)
		}
		s.notifyQueue(ctx, o.queue)
	}
	return nil
}

// enqueueMissingJob inserts a River job for context id, whose job was gone
// when reconcile looked, and returns its id; or returns 0 when the context
// has a job by now (another supervisor reconciling at the same time gave it
// one). Concurrent reconciles take turns on the context's row lock, held
// until the insert commits, so whoever comes second sees the job the first
// committed. That check must be a statement of its own, run once the lock is
// granted: under READ COMMITTED a statement sees only what was committed
// before it began, so a check inside the locking statement would re-read the
// context's new river_job_id yet miss the job it names.
func (s *Supervisor) enqueueMissingJob(ctx context.Context, id int64, queue, kind string, maxAttempts int) (int64, error) {
	var inserted int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var current *int64
		if err := tx.QueryRow(ctx, `
			SELECT river_job_id FROM data_manager.etl_contexts WHERE etl_context_id = $1 FOR UPDATE`,
			id).Scan(&current); err != nil {
			return fmt.Errorf("lock etl context: %w", err)
		}
		if current != nil {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE id = $1)`, *current).Scan(&exists); err != nil {
				return fmt.Errorf("look for job %d: %w", *current, err)
			}
			if exists {
				return nil
			}
		}
		res, err := s.river.InsertTx(ctx, tx, TaskArgs{ETLContextID: id, TaskKind: kind}, &river.InsertOpts{Queue: queue, MaxAttempts: maxAttempts})
		if err != nil {
			return fmt.Errorf("insert job: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE data_manager.etl_contexts SET river_job_id = $2 WHERE etl_context_id = $1`, id, res.Job.ID); err != nil {
			return fmt.Errorf("record job %d: %w", res.Job.ID, err)
		}
		inserted = res.Job.ID
		return nil
	})
	if err != nil {
		return 0, err
	}
	return inserted, nil
}

// listen serves l until ctx ends, reconnecting when the connection fails.
func (s *Supervisor) listen(ctx context.Context, l *listener) {
	for {
		err := s.serveListener(ctx, l)
		l.conn.Close(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return
		}
		s.logger.Warn("listening connection failed; reconnecting", "error", err)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if l, err = s.connectListener(ctx); err == nil {
				s.metrics.reconnects.WithLabelValues("listener").Inc()
				break
			}
			s.logger.Warn("reconnect listening connection", "error", err)
		}
	}
}

func (s *Supervisor) serveListener(ctx context.Context, l *listener) error {
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == etlcontext.ControlChannel {
			var c etlcontext.Control
			if json.Unmarshal([]byte(n.Payload), &c) == nil {
				go s.controlled(ctx, c)
			}
			continue
		}
		id, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			continue
		}
		s.mu.Lock()
		_, mine := s.children[id]
		s.mu.Unlock()
		if !mine {
			go s.wake(ctx, id)
		}
	}
}

// controlled starts the tasks a resumed queue or an unblocked kind held
// back.
func (s *Supervisor) controlled(ctx context.Context, c etlcontext.Control) {
	for _, q := range s.cfg.QueueNames() {
		if c.Queue == q || c.Kind != "" {
			s.wakeWaiting(ctx, q)
		}
	}
}
