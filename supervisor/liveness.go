package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/internal/pgsession"
)

// The application_name prefixes of the supervisor's own connections, followed
// by its River client id (pg_stat_activity keeps 63 bytes of a name).
const (
	livenessAppNamePrefix = "dama-supervisor-liveness:"
	listenAppNamePrefix   = "dama-supervisor-listen:"
)

const (
	// livenessCheckInterval is how often the liveness connection is pinged,
	// to catch one that fails silently (a terminated backend is noticed at
	// once), and livenessPingTimeout how long a ping may take.
	livenessCheckInterval = time.Second
	livenessPingTimeout   = 5 * time.Second
	// livenessRetryInterval spaces the attempts to take the lock again after
	// the first, immediate one failed.
	livenessRetryInterval = time.Second
	// minRescueGrace leaves room for several tries to take the liveness
	// lock again against a slow or restarting server.
	minRescueGrace = 10 * time.Second
)

// rescueGraceFor is how long a running job's client lock must be seen
// missing, at every look (once per poll interval), before its step is
// rescued: max(2*poll_interval, 10s).
func rescueGraceFor(pollInterval time.Duration) time.Duration {
	return max(2*pollInterval, minRescueGrace)
}

// connectNamed opens a connection of its own, not the pool's (it holds a
// session lock or listens), named for pg_stat_activity, that the server
// ends once this host went silent: so the liveness lock of a supervisor
// whose host vanished is released, and its tasks' steps rescued.
func (s *Supervisor) connectNamed(ctx context.Context, name string) (*pgx.Conn, error) {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = name
	pgsession.EndWhenSilent(cfg)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	if err := pgsession.KeepIdle(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	return conn, nil
}

// newLiveness is the liveness connection, which holds the supervisor's
// liveness lock for as long as it lives: when it fails, another takes the
// lock again (pglisten.Listener.RetryDelay).
func (s *Supervisor) newLiveness() *pglisten.Listener[*pgx.Conn] {
	var lostAt, remindedAt time.Time
	return &pglisten.Listener[*pgx.Conn]{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := s.connectNamed(ctx, livenessAppNamePrefix+s.river.ID())
			if err != nil {
				return nil, fmt.Errorf("open liveness connection: %w", err)
			}
			// pg_advisory_lock waits while the lock is held: the holder is a
			// session of this supervisor whose connection failed without the
			// server noticing yet.
			const lock = `SELECT pg_advisory_lock($1, hashtext($2))`
			if _, err := conn.Exec(ctx, lock, etlcontext.ClientLockNamespace, s.river.ID()); err != nil {
				conn.Close(context.WithoutCancel(ctx))
				return nil, fmt.Errorf("take supervisor liveness lock: %w", err)
			}
			return conn, nil
		},
		Look: func(ctx context.Context, conn *pgx.Conn) error {
			pingCtx, cancel := context.WithTimeout(ctx, livenessPingTimeout)
			defer cancel()
			if err := conn.Ping(pingCtx); err != nil {
				return fmt.Errorf("ping liveness connection: %w", err)
			}
			return nil
		},
		Recheck:    livenessCheckInterval,
		RetryDelay: livenessRetryInterval,
		Failed: func(err error) bool {
			if lostAt.IsZero() {
				lostAt, remindedAt = time.Now(), time.Now()
				// Not s.logger: that would hold this line as the outage's
				// symptom, and mute it.
				s.opts.Logger.Error("lost the database connection: tasks keep running; reconnecting", "error", err)
				// Until it is back, everything that needs the database
				// fails: the outage is this line and the one at its end. A
				// server that answers (a refused password) is no outage,
				// but too many clients is: no connection can be made.
				if etlcontext.Unreachable(err) {
					s.outage.Begin()
				}
				return true
			}
			if time.Since(remindedAt) >= outageReminder {
				remindedAt = time.Now()
				s.opts.Logger.Warn("database still unreachable", "error", err, "for", time.Since(lostAt).Round(time.Second))
			}
			return true
		},
		Reconnected: func() {
			s.metrics.reconnects.WithLabelValues("liveness").Inc()
			muted := s.outage.End()
			s.logger.Info("database connection back; other supervisors see this one alive again", "outage", time.Since(lostAt).Round(time.Millisecond), "warnings_muted", muted)
			lostAt = time.Time{}
		},
	}
}

// outageReminder is how often a long outage is logged again.
const outageReminder = 5 * time.Minute

// outageGrace is how long the warnings of those who may notice a lost
// database as the liveness connection does wait, to be muted if it is an
// outage.
const outageGrace = time.Second

// lostTheDatabase reports a record whose error says the database is
// unreachable, as the supervisor's own loops may before its liveness
// connection does.
func lostTheDatabase(r slog.Record) bool {
	lost := false
	r.Attrs(func(a slog.Attr) bool {
		err, ok := a.Value.Any().(error)
		lost = ok && etlcontext.Unreachable(err)
		return !lost
	})
	return lost
}

// fetchAnswerWait bounds how long after a fetch of this client's River its
// answer, if it ever comes, reaches a Work: River waits 10 s for a fetch
// (its internal HotOperationTimeout), and a Work begins at once.
const fetchAnswerWait = 15 * time.Second

// suspect is a running job: the job, the client that last fetched it, and
// when (a job fetched again is another suspect).
type suspect struct {
	jobID       int64
	client      string
	attemptedAt int64 // microseconds since the epoch, as PostgreSQL stores it
}

func fetchOf(jobID int64, client string, at time.Time) suspect {
	return suspect{jobID: jobID, client: client, attemptedAt: at.UnixMicro()}
}

// What rescueOrphanedSteps logs of a job it makes available again: of a
// supervisor that stopped, or of a fetch of this one.
const (
	handedOnLine  = "a supervisor stopped looking after a task: any supervisor may take it up now; no attempt spent"
	lostFetchLine = "tasks given to this supervisor never reached it: any supervisor may take them up now; no attempt spent"
)

// rescueOrphanedSteps makes available again, without spending an attempt,
// the jobs that a dead supervisor left 'running', and those this
// supervisor's River client fetched but never received (docs/architecture.md:
// "Dead supervisors mid-step", "A fetch whose answer was lost"). A Work older
// than its timeout and a step's is rescued on sight. Otherwise, as one look
// at pg_locks proves nothing, a job is rescued once this supervisor has seen
// its client's lock missing at every look for s.rescueGrace; its own fetch,
// once no Work of it has begun it for as long.
func (s *Supervisor) rescueOrphanedSteps(ctx context.Context) error {
	s.rescueMu.Lock()
	defer s.rescueMu.Unlock()
	queues := map[string]bool{}
	rescued := func(jobs []etlcontext.Rescued, why string) {
		for _, r := range jobs {
			queues[r.Queue] = true
			s.logger.Info(handedOnLine, "etl_context_id", r.Task, "job_id", r.ID, "why", why)
		}
	}

	staleAfter := workTimeout(s.opts.LaunchTimeout) + stepTimeout(s.opts.LaunchTimeout)
	stale, err := etlcontext.RescueStaleSteps(ctx, s.pool, staleAfter)
	if err != nil {
		return err
	}
	rescued(stale, fmt.Sprintf("its supervisor has held it for over %s without a word", staleAfter))

	own, looked := s.river.ID(), time.Now()
	seen, err := etlcontext.AbandonedSteps(ctx, s.pool, own, fetchAnswerWait)
	if err != nil {
		return err
	}
	received := s.receivedFetches(looked, own, seen)
	// Only the suspects seen now are remembered: a job whose client's lock
	// came back, that finished, or that was fetched again starts over.
	now := time.Now()
	next := make(map[suspect]time.Time, len(seen))
	var due, lost []etlcontext.Step
	gone := map[int64]int{} // a job's supervisor's pid, gone from this host
	for _, step := range seen {
		sus := fetchOf(step.JobID, step.Client, step.AttemptedAt)
		mine := step.Client == own && !step.Abandoned
		if mine && (received[sus] || !step.Old) {
			// Received, or its answer may still come.
			continue
		}
		first := cmp.Or(s.suspects[sus], now)
		next[sus] = first
		if s.diedHere(step) {
			gone[step.JobID] = step.PID
		} else if now.Sub(first) < s.rescueGrace {
			continue
		}
		if mine {
			lost = append(lost, step)
		} else {
			due = append(due, step)
		}
	}
	s.suspects = next
	lost = s.giveBack(own, lost)
	if len(due)+len(lost) > 0 {
		jobs, err := etlcontext.RescueSteps(ctx, s.pool, own, append(due, lost...))
		if err != nil {
			return err
		}
		var found, tasks []int64
		for _, r := range jobs {
			if slices.ContainsFunc(lost, func(l etlcontext.Step) bool { return l.JobID == r.ID }) {
				found, tasks = append(found, r.ID), append(tasks, r.Task)
				queues[r.Queue] = true
			} else if pid, ok := gone[r.ID]; ok {
				rescued([]etlcontext.Rescued{r}, fmt.Sprintf("its supervisor, process %d of this host, is gone", pid))
			} else {
				rescued([]etlcontext.Rescued{r}, fmt.Sprintf("its supervisor was not seen for %s: stopped, or cut off from the database", s.rescueGrace))
			}
		}
		if len(found) > 0 {
			// One line per look, however many a lost fetch held.
			s.logger.Warn(lostFetchLine, "tasks", len(found), "etl_context_ids", tasks[:min(len(tasks), 10)], "job_ids", found[:min(len(found), 10)],
				"why", fmt.Sprintf("the database's answer that gave them to this supervisor was lost, and it did not take them up for %s", s.rescueGrace))
		}
	}
	for q := range queues {
		s.notifyQueue(ctx, q)
	}
	return nil
}

// diedHere reports a step that nobody looks after whose supervisor ran on
// this host as a process that is gone: proof of its death that needs no
// grace, so that a supervisor restarted after a crash adopts its tasks at
// once. A pid that is there, even reused by another process, proves
// nothing; nor does one /proc hides (hidepid), which kill(2) still finds.
func (s *Supervisor) diedHere(step etlcontext.Step) bool {
	if !step.Abandoned || step.HostID != s.hostID || step.PID <= 0 {
		return false
	}
	return errors.Is(unix.Kill(step.PID, 0), unix.ESRCH)
}

// receivedFetches returns which of seen, the running steps a look begun at
// looked found, are fetches of own that a Work here began, and forgets the
// fetches begun (or given back) before that look which no longer run.
func (s *Supervisor) receivedFetches(looked time.Time, own string, seen []etlcontext.Step) map[suspect]bool {
	running := map[suspect]bool{}
	for _, step := range seen {
		if step.Client == own {
			running[fetchOf(step.JobID, step.Client, step.AttemptedAt)] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for f, began := range s.begun {
		if !running[f] && began.Before(looked) {
			delete(s.begun, f)
		}
	}
	received := map[suspect]bool{}
	for f := range running {
		if began, ok := s.begun[f]; ok && !began.IsZero() {
			received[f] = true
		}
	}
	return received
}

// giveBack returns those of lost, fetches of own that no Work began, that
// still none began, and marks them given back (the zero time in begun), in
// one critical section with begin: a Work that begins one after this writes
// nothing over its job, one that began it before keeps it.
func (s *Supervisor) giveBack(own string, lost []etlcontext.Step) []etlcontext.Step {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.DeleteFunc(lost, func(step etlcontext.Step) bool {
		f := fetchOf(step.JobID, own, step.AttemptedAt)
		if began, ok := s.begun[f]; ok && !began.IsZero() {
			return true
		}
		// The zero time: given back.
		s.begun[f] = time.Time{}
		return false
	})
}
