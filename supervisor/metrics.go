package supervisor

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// metrics are what a supervisor counts of its own work, for Prometheus:
// summed over every supervisor, the cluster's (a step retried after a lost
// connection may count an outcome twice). What the database holds is read
// at each scrape by [NewStatsCollector] instead.
type metrics struct {
	attemptsStarted *prometheus.CounterVec
	attemptsFailed  *prometheus.CounterVec
	tasksFinished   *prometheus.CounterVec
	runSeconds      *prometheus.HistogramVec
	submitToLock    *prometheus.HistogramVec
	adopted         *prometheus.GaugeVec
	lockLosses      *prometheus.CounterVec
	reconnects      *prometheus.CounterVec
	heard           *prometheus.CounterVec
	stepErrors      prometheus.Counter
	pruned          *prometheus.CounterVec
}

// Why an attempt failed, the reason label of dama_attempts_failed_total.
const (
	failedError    = "error"
	failedTimedOut = "timed_out"
	failedLockLost = "lock_lost"
)

func newMetrics() *metrics {
	qk := []string{"queue", "kind"}
	counter := func(name string, labels []string, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	return &metrics{
		attemptsStarted: counter("dama_attempts_started_total", qk,
			"Attempts whose task process this supervisor launched and heard take its lock (within the launch timeout, or up to 10 minutes after it)."),
		attemptsFailed: counter("dama_attempts_failed_total", append(qk, "reason"),
			"Failed attempts this supervisor settled, by reason: error (the command failed), timed_out (by the kind's timeout, or its stall_after with on_stall kill), lock_lost (the task process died or lost its lock)."),
		tasksFinished: counter("dama_tasks_finished_total", append(qk, "status"),
			"Tasks this supervisor settled as finished, by status (DONE, FAILED, CANCELLED); a task cancelled by dama cancel before any supervisor looked at it is not counted."),
		runSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dama_task_run_seconds",
			Help: "Time from a finished task's first start to its end, by status.",
			// From a second to about three days: tasks run for days.
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}, append(qk, "status")),
		submitToLock: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dama_submit_to_lock_seconds",
			Help: "Time from when a task was due (its submission, or its --delay or --run-at) to its first attempt's task process holding the lock, the wait for a slot included.",
			// From 10ms to about 3 hours.
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 11),
		}, qk),
		adopted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dama_adopted_tasks",
			Help: "Tasks running in this supervisor's queues when it started, which it adopted (after a redeploy, the tasks that ran through it).",
		}, qk),
		lockLosses: counter("dama_lock_losses_total", qk,
			"Attempts this supervisor recorded dead: their lock was free while they were recorded running (the task process died, or lost its lock and stopped), a cancelled attempt included."),
		reconnects: counter("dama_reconnects_total", []string{"connection"},
			"Reconnections of this supervisor's own connections after they failed, by connection (liveness, listener)."),
		heard: counter("dama_notifications_total", []string{"channel", "outcome"},
			"Notifications this supervisor's listener heard, by channel and what became of them: queued for a worker, dropped (a flood past 10,000 pending: the poll interval's watch makes up for them), or ignored (its own task's, or not dama's)."),
		stepErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dama_step_errors_total",
			Help: "Steps that failed for a reason that says nothing about the task (the database was unreachable, a statement timed out) and were tried again.",
		}),
		pruned: counter("dama_pruned_total", []string{"what"},
			"What this supervisor removed of the finished tasks older than retention, by what: tasks, events, attempts, jobs (River's)."),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.attemptsStarted, m.attemptsFailed, m.tasksFinished, m.runSeconds,
		m.submitToLock, m.adopted, m.lockLosses, m.reconnects, m.heard, m.stepErrors, m.pruned}
}

// zero creates the counters of every configured queue and kind at 0: a
// series that first appears at 1 hides that increase from increase().
func (m *metrics) zero(cfg *config.Config) {
	for _, name := range cfg.KindNames() {
		k := cfg.Kinds[name]
		m.attemptsStarted.WithLabelValues(k.Queue, name)
		m.lockLosses.WithLabelValues(k.Queue, name)
		m.adopted.WithLabelValues(k.Queue, name)
		for _, reason := range []string{failedError, failedTimedOut, failedLockLost} {
			m.attemptsFailed.WithLabelValues(k.Queue, name, reason)
		}
		for _, st := range []etlcontext.Status{etlcontext.StatusDone, etlcontext.StatusFailed, etlcontext.StatusCancelled} {
			m.tasksFinished.WithLabelValues(k.Queue, name, string(st))
		}
	}
	for _, what := range []string{"tasks", "events", "attempts", "jobs"} {
		m.pruned.WithLabelValues(what)
	}
	for _, conn := range []string{"liveness", "listener"} {
		m.reconnects.WithLabelValues(conn)
	}
	for _, ch := range []string{protocol.ExitedChannel, etlcontext.ControlChannel} {
		for _, outcome := range []string{heardQueued, heardIgnored} {
			m.heard.WithLabelValues(ch, outcome)
		}
	}
}

// lockedAfterSubmit observes a first attempt's wait, from when the task was
// due, by the database's clock, to at, when its task process held its
// lock, by this host's or the pod's: a skew between them is cut at 0.
func (m *metrics) lockedAfterSubmit(c *etlcontext.Context, at time.Time) {
	due := c.CreatedAt
	if c.DueAt != nil && c.DueAt.After(due) {
		due = *c.DueAt
	}
	m.submitToLock.WithLabelValues(c.Queue, c.Kind).Observe(max(at.Sub(due).Seconds(), 0))
}

// finished counts a task this supervisor settled as finished.
func (m *metrics) finished(c *etlcontext.Context) {
	m.tasksFinished.WithLabelValues(c.Queue, c.Kind, string(c.Status)).Inc()
	if c.StartedAt != nil && c.FinishedAt != nil {
		m.runSeconds.WithLabelValues(c.Queue, c.Kind, string(c.Status)).Observe(c.FinishedAt.Sub(*c.StartedAt).Seconds())
	}
}

// failed counts a failed attempt this supervisor settled.
func (m *metrics) failed(c *etlcontext.Context, f etlcontext.Failure) {
	reason := failedError
	if f.TimedOut {
		reason = failedTimedOut
	}
	m.attemptsFailed.WithLabelValues(c.Queue, c.Kind, reason).Inc()
}

// statsCollector reads the tasks' statistics from the database at each
// scrape (data_manager.dama_queue_stats, indexed to be read every second).
type statsCollector struct {
	db etlcontext.DB

	up, tasks, finished24h, oldest, paused, blocked, stalled *prometheus.Desc
	// What the attempts of each kind that ended in the last 24 hours cost,
	// by their control groups' counters.
	costAttempts, cpu, peakMemory, readBytes, writeBytes, oomKilled *prometheus.Desc
}

// NewStatsCollector returns a Prometheus collector of what the database
// holds about the tasks, read at each scrape: every program serving it
// exposes the same figures, so aggregate them with max, not sum.
//
//	dama_stats_up                                    1 when the statistics could be read, else 0 (and none of the below)
//	dama_tasks{queue,kind,status}                    unfinished tasks: QUEUED (due), SCHEDULED (not due yet), RUNNING, RETRYING
//	dama_tasks_finished_24h{queue,kind,status}       tasks finished in the last 24 h: DONE, FAILED, CANCELLED
//	dama_queue_oldest_waiting_seconds{queue,kind}    how long the oldest due task has waited to start
//	dama_queue_paused{queue}, dama_kind_blocked{kind} 1 when paused or blocked
//	dama_attempts_measured_24h{kind}                 attempts that ended in the last 24 h in a control group of their own, and what they cost:
//	dama_attempt_cpu_seconds_24h{kind}, dama_attempt_peak_memory_bytes_24h{kind} (the largest),
//	dama_attempt_io_read_bytes_24h{kind}, dama_attempt_io_write_bytes_24h{kind}, dama_attempts_oom_killed_24h{kind}
//	dama_tasks_stalled{queue,kind}                   running tasks marked stalled (a kind's stall_after)
func NewStatsCollector(db etlcontext.DB) prometheus.Collector {
	qk := []string{"queue", "kind"}
	k := []string{"kind"}
	return &statsCollector{
		costAttempts: prometheus.NewDesc("dama_attempts_measured_24h", "Attempts that ended in the last 24 hours in a control group of their own (resources, cgroup_parent).", k, nil),
		cpu:          prometheus.NewDesc("dama_attempt_cpu_seconds_24h", "CPU time of the kind's attempts that ended in the last 24 hours, by their control groups.", k, nil),
		peakMemory:   prometheus.NewDesc("dama_attempt_peak_memory_bytes_24h", "The largest peak memory of the kind's attempts that ended in the last 24 hours.", k, nil),
		readBytes:    prometheus.NewDesc("dama_attempt_io_read_bytes_24h", "Block IO read by the kind's attempts that ended in the last 24 hours.", k, nil),
		writeBytes:   prometheus.NewDesc("dama_attempt_io_write_bytes_24h", "Block IO written by the kind's attempts that ended in the last 24 hours.", k, nil),
		oomKilled:    prometheus.NewDesc("dama_attempts_oom_killed_24h", "The kind's attempts that ended in the last 24 hours with a process killed for their memory limit.", k, nil),
		db:           db,
		up:           prometheus.NewDesc("dama_stats_up", "1 when the database's statistics could be read at this scrape, else 0.", nil, nil),
		tasks:        prometheus.NewDesc("dama_tasks", "Unfinished tasks by status: QUEUED (due), SCHEDULED (not due yet), RUNNING, RETRYING.", append(qk, "status"), nil),
		finished24h:  prometheus.NewDesc("dama_tasks_finished_24h", "Tasks finished in the last 24 hours, by status.", append(qk, "status"), nil),
		oldest:       prometheus.NewDesc("dama_queue_oldest_waiting_seconds", "How long the oldest due task of the queue and kind has waited to start; 0 when none waits.", qk, nil),
		paused:       prometheus.NewDesc("dama_queue_paused", "1 when the queue is paused.", []string{"queue"}, nil),
		blocked:      prometheus.NewDesc("dama_kind_blocked", "1 when the kind is blocked.", []string{"kind"}, nil),
		stalled:      prometheus.NewDesc("dama_tasks_stalled", "Running tasks marked stalled: their command reported nothing, on its events pipe or in its log, for their kind's stall_after.", qk, nil),
	}
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.tasks, c.finished24h, c.oldest, c.paused, c.blocked, c.stalled,
		c.costAttempts, c.cpu, c.peakMemory, c.readBytes, c.writeBytes, c.oomKilled} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	stats, err := etlcontext.QueueStats(ctx, c.db)
	if err != nil {
		// The series vanish, and dama_stats_up says why, rather than
		// the whole scrape failing: the other metrics matter most then.
		gauge(c.up, 0)
		return
	}
	gauge(c.up, 1)
	pausedSeen := map[string]bool{}
	blockedSeen := map[string]bool{}
	for _, s := range stats {
		// A paused queue without tasks has no kind, a blocked kind
		// without tasks no queue.
		if s.Queue != nil && !pausedSeen[*s.Queue] {
			pausedSeen[*s.Queue] = true
			gauge(c.paused, boolFloat(s.Paused), *s.Queue)
		}
		if s.Kind != nil && !blockedSeen[*s.Kind] {
			blockedSeen[*s.Kind] = true
			gauge(c.blocked, boolFloat(s.Blocked), *s.Kind)
		}
		if s.Queue == nil || s.Kind == nil {
			continue
		}
		q, k := *s.Queue, *s.Kind
		gauge(c.tasks, float64(s.Queued), q, k, string(etlcontext.StatusQueued))
		gauge(c.tasks, float64(s.Scheduled), q, k, "SCHEDULED")
		gauge(c.tasks, float64(s.Running), q, k, string(etlcontext.StatusRunning))
		gauge(c.tasks, float64(s.Retrying), q, k, string(etlcontext.StatusRetrying))
		gauge(c.finished24h, float64(s.Done24h), q, k, string(etlcontext.StatusDone))
		gauge(c.finished24h, float64(s.Failed24h), q, k, string(etlcontext.StatusFailed))
		gauge(c.finished24h, float64(s.Cancelled24h), q, k, string(etlcontext.StatusCancelled))
		var oldest float64
		if s.OldestWaiting != nil {
			oldest = s.OldestWaiting.Seconds()
		}
		gauge(c.oldest, oldest, q, k)
		gauge(c.stalled, float64(s.Stalled), q, k)
	}
	costs, err := etlcontext.KindCosts(ctx, c.db)
	if err != nil {
		return
	}
	for _, k := range costs {
		gauge(c.costAttempts, float64(k.Attempts), k.Kind)
		gauge(c.cpu, k.CPUSeconds, k.Kind)
		gauge(c.peakMemory, k.PeakMemory, k.Kind)
		gauge(c.readBytes, k.ReadBytes, k.Kind)
		gauge(c.writeBytes, k.WriteBytes, k.Kind)
		gauge(c.oomKilled, float64(k.OOMKilled), k.Kind)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// poolCollector reports a pgx pool's statistics.
type poolCollector struct {
	pool *pgxpool.Pool

	conns, maxConns, acquires, acquireWait, emptyAcquires, canceledAcquires *prometheus.Desc
}

// NewPoolCollector returns a Prometheus collector of pool's statistics,
// named dama_pool_*.
func NewPoolCollector(pool *pgxpool.Pool) prometheus.Collector {
	return &poolCollector{
		pool:             pool,
		conns:            prometheus.NewDesc("dama_pool_connections", "Connections of the database pool, by state (acquired, idle, constructing).", []string{"state"}, nil),
		maxConns:         prometheus.NewDesc("dama_pool_max_connections", "The database pool's size.", nil, nil),
		acquires:         prometheus.NewDesc("dama_pool_acquires_total", "Connections acquired from the pool.", nil, nil),
		acquireWait:      prometheus.NewDesc("dama_pool_acquire_wait_seconds_total", "Time spent waiting for a connection of the pool.", nil, nil),
		emptyAcquires:    prometheus.NewDesc("dama_pool_empty_acquires_total", "Acquisitions that had to wait for a connection.", nil, nil),
		canceledAcquires: prometheus.NewDesc("dama_pool_canceled_acquires_total", "Acquisitions given up before a connection was free.", nil, nil),
	}
}

// Describe collects once: the pool's statistics cost nothing to read.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.AcquiredConns()), "acquired")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.IdleConns()), "idle")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.ConstructingConns()), "constructing")
	ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(st.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(st.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.acquireWait, prometheus.CounterValue, st.AcquireDuration().Seconds())
	ch <- prometheus.MustNewConstMetric(c.emptyAcquires, prometheus.CounterValue, float64(st.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.canceledAcquires, prometheus.CounterValue, float64(st.CanceledAcquireCount()))
}
