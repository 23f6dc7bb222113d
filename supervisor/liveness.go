package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/internal/pgsession"
)

// The application_name prefixes of the supervisor's own connections, followed
// by its River client id, so that an operator (or a test) can tell them apart
// in pg_stat_activity. PostgreSQL keeps the first 63 bytes of a name.
const (
	livenessAppNamePrefix = "dama-supervisor-liveness:"
	listenAppNamePrefix   = "dama-supervisor-listen:"
)

const (
	// livenessCheckInterval is how often the liveness connection is pinged.
	// A terminated backend is noticed at once (the connection is read from
	// all the time); the ping catches a connection that fails silently.
	livenessCheckInterval = time.Second
	// livenessPingTimeout bounds a ping: a server that does not answer in
	// that time is treated as gone, and the lock taken again elsewhere.
	livenessPingTimeout = 5 * time.Second
	// livenessRetryInterval spaces the attempts to take the lock again after
	// the first, immediate one failed.
	livenessRetryInterval = time.Second
	// minRescueGrace is the least time a client's lock must be seen missing
	// before its steps are rescued. A live supervisor takes its lock again
	// at once when its liveness connection fails (then once a second): 10s
	// leaves room for several tries against a slow or restarting server.
	minRescueGrace = 10 * time.Second
)

// rescueGraceFor is how long a running job's client lock must be seen
// missing before its step is rescued: max(2*poll_interval, 10s). The rescue
// loop looks once per poll interval, so the lock is seen missing at least
// twice, a grace apart; a supervisor that takes its lock back within the
// grace keeps its steps. A dead supervisor's step is thus rescued between the
// grace and the grace plus two poll intervals after it died.
func rescueGraceFor(pollInterval time.Duration) time.Duration {
	return max(2*pollInterval, minRescueGrace)
}

// connectNamed opens a connection of its own (never one of the pool's: it
// holds a session lock or listens, and must not be handed to anyone else),
// named for pg_stat_activity.
func (s *Supervisor) connectNamed(ctx context.Context, name string) (*pgx.Conn, error) {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = name
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

// connectLiveness opens the liveness connection and takes the supervisor's
// liveness lock on it. pg_advisory_lock waits, rather than failing, while the
// lock is held: only this supervisor takes it, so a holder is a session of
// its own whose connection failed without the server noticing yet, and the
// lock stays held, as it should, until that session ends and this one gets
// it.
func (s *Supervisor) connectLiveness(ctx context.Context) (*pgx.Conn, error) {
	conn, err := s.connectNamed(ctx, livenessAppNamePrefix+s.river.ID())
	if err != nil {
		return nil, fmt.Errorf("open liveness connection: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, etlcontext.ClientLockNamespace, s.river.ID()); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("take supervisor liveness lock: %w", err)
	}
	return conn, nil
}

// newLiveness is the liveness connection, which holds the supervisor's
// liveness lock for as long as it lives: when the connection fails, another
// is opened and takes the lock again, at once if the one lost had lasted
// livenessRetryInterval, then after 100 ms, doubling up to
// livenessRetryInterval (pglisten.Listener.RetryDelay). It is waited on, so that a backend ended by the
// server (pg_terminate_backend, a restart) is noticed as soon as the server
// says so, and pinged every livenessCheckInterval, so that a connection
// that fails silently is noticed within livenessPingTimeout. Other
// supervisors rescue this one's steps only if the lock stays missing for
// the rescue grace.
func (s *Supervisor) newLiveness() *pglisten.Listener[*pgx.Conn] {
	var lostAt, remindedAt time.Time
	return &pglisten.Listener[*pgx.Conn]{
		Connect: s.connectLiveness,
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
				// fails (River's fetches several times a second): the
				// outage is this line and the one at its end. A server
				// that answers (a refused password, a revoked grant) is
				// no outage: what fails meanwhile is worth reading. Too
				// many clients counts as one (etlcontext.ConnectionLost): no
				// new connection can be made, as in a restart.
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
			s.logger.Info("database connection back; liveness lock taken again", "outage", time.Since(lostAt).Round(time.Millisecond), "warnings_muted", muted)
			lostAt = time.Time{}
		},
	}
}

// outageReminder is how often a long outage is logged again.
const outageReminder = 5 * time.Minute

// outageGrace is how long the warnings of those who notice a lost
// database at the same instant as the liveness connection (River, the
// listening connection) wait, to be muted if it is an outage.
const outageGrace = time.Second

// lostTheDatabase reports a record whose error says the database is
// unreachable: the supervisor's own loops (pruning, adoption) may meet the
// outage just before the liveness connection does.
func lostTheDatabase(r slog.Record) bool {
	lost := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && etlcontext.Unreachable(err) {
			lost = true
			return false
		}
		return true
	})
	return lost
}

// fetchAnswerWait bounds how long after a fetch of this client's River
// its answer, if it ever comes, reaches a Work: River waits 10 s for a
// fetch (HotOperationTimeout, internal to River), from before the fetch's
// statement takes the time it records, and a Work begins at once.
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

// rescueOrphanedSteps makes available again the jobs that a dead supervisor
// left 'running' mid-step, without spending an attempt, as a snooze would.
// River's own rescuer would wait an hour and then count the step as a failed
// attempt, or discard the job of a task that is still running. So too the
// jobs this supervisor's River client fetched but never received: a fetch
// whose statement committed while its answer was lost (a timeout during a
// failover did that in a chaos run) leaves them running under a live client,
// for nobody, until the Work timeout (over half an hour).
//
// A Work older than its timeout and a step's is surely dead and rescued on
// sight. Otherwise one look at pg_locks proves nothing (the supervisor may be
// taking its lock again after its liveness connection failed), so a job is
// rescued only once this supervisor has seen its client's lock missing at
// every look for s.rescueGrace; its own fetch, once no Work of it has begun
// it for as long. A rescued step that was in fact alive is harmless (steps
// are idempotent, a Work outlives one that took its job over, and a task's
// own lock keeps a second copy from starting), but it wastes a step and
// muddles the logs.
func (s *Supervisor) rescueOrphanedSteps(ctx context.Context) error {
	s.rescueMu.Lock()
	defer s.rescueMu.Unlock()
	queues := map[string]bool{}
	rescued := func(jobs []etlcontext.Rescued, why string) {
		for _, r := range jobs {
			queues[r.Queue] = true
			s.logger.Info("rescued the step of a dead supervisor", "job_id", r.ID, "why", why)
		}
	}

	stale, err := etlcontext.RescueStaleSteps(ctx, s.pool, workTimeout(s.opts.LaunchTimeout)+stepTimeout(s.opts.LaunchTimeout))
	if err != nil {
		return err
	}
	rescued(stale, "older than its timeout")

	own, looked := s.river.ID(), time.Now()
	seen, err := etlcontext.AbandonedSteps(ctx, s.pool, own, fetchAnswerWait)
	if err != nil {
		return err
	}
	received := s.receivedFetches(looked, own, seen)
	// Only the suspects seen now are remembered: a job whose client's lock
	// came back, that finished, or that was fetched again starts over. A
	// rescued job stays until the next look, which no longer finds it
	// running under that attempt and drops it.
	now := time.Now()
	next := make(map[suspect]time.Time, len(seen))
	var due, lost []etlcontext.Step
	for _, step := range seen {
		sus := fetchOf(step.JobID, step.Client, step.AttemptedAt)
		mine := step.Client == own && !step.Abandoned
		if mine && (received[sus] || !step.Old) {
			// Received, or its answer may still come.
			continue
		}
		first, ok := s.suspects[sus]
		if !ok {
			first = now
		}
		next[sus] = first
		if now.Sub(first) < s.rescueGrace {
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
		var found []int64
		for _, r := range jobs {
			if slices.ContainsFunc(lost, func(l etlcontext.Step) bool { return l.JobID == r.ID }) {
				found = append(found, r.ID)
				queues[r.Queue] = true
			} else {
				rescued([]etlcontext.Rescued{r}, fmt.Sprintf("nobody looked after it for %s", s.rescueGrace))
			}
		}
		if len(found) > 0 {
			// One line per look, however many a lost fetch held.
			s.logger.Warn("rescued the jobs of a fetch of this supervisor whose answer was lost", "jobs", len(found), "job_ids", found[:min(len(found), 10)], "why", fmt.Sprintf("no Work of it began them for %s", s.rescueGrace))
		}
	}
	for q := range queues {
		s.notifyQueue(ctx, q)
	}
	return nil
}

// receivedFetches returns which of seen, the running steps a look begun at
// looked found, are fetches of own that a Work of this supervisor began,
// and forgets the fetches begun (or given back) before that look which no
// longer run.
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
// still none began, and marks them given back (the zero time in begun:
// begun before any look), in one critical section
// with begin: a Work that begins one after this writes nothing over its
// job, one that began it before keeps it.
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
