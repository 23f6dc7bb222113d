package supervisor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/logdir"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/internal/runas"
	"github.com/dama-etl/dama/internal/submit"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/version"
)

// River's fetch settings: every task start and finish goes through a fetch,
// so dama's defaults are tighter than River's own (100ms and 1s).
const (
	defaultFetchCooldown     = fetchCooldown
	defaultFetchPollInterval = 250 * time.Millisecond
)

// Supervisor runs the tasks of the configured kinds.
type Supervisor struct {
	cfg  *config.Config
	opts Options
	// program is the file task processes are executed from.
	program *program
	pool    *pgxpool.Pool
	river   *river.Client[pgx.Tx]
	// client submits the tasks of periodic kinds' ticks.
	submit *submit.Submitter
	// logger is Options.Logger, muted while outage lasts (from the
	// liveness connection's loss to its return).
	logger *slog.Logger
	outage outageMuter
	host   string
	hostID string
	// keeperSecret is what its task processes and their host's lock
	// keeper prove to each other (internal/keeper), made at random here:
	// it reaches them on their secrets sockets, and names their keeper's
	// socket, so that each supervisor's task processes have a keeper of
	// their own.
	keeperSecret []byte

	// fence times the fencing windows of attempts on other hosts.
	fence fenceClock

	mu       sync.Mutex
	children map[int64]*child
	// stopping holds the contexts whose dead attempt's orphans are being
	// stopped.
	stopping map[int64]bool
	// orphans tracks the goroutines stopping them, which Run waits for;
	// orphanCtx (nil outside Run) ends them, and orphanSlots bounds them.
	orphans     sync.WaitGroup
	orphanCtx   context.Context
	orphanSlots chan struct{}
	// launchFailures holds, per context, the last failed launch reported, so
	// that a failure repeating at every poll is logged as an error once.
	launchFailures map[int64]string
	// spawnFailures holds why this supervisor could not spawn a context's
	// task process, until the failure is reported.
	spawnFailures map[int64]string
	// pendingStarts holds, for each task this supervisor launched whose
	// task process has not held its lock yet, what counts the attempt
	// started (called once, by whoever learns of the start first:
	// startedLate).
	pendingStarts map[int64]func(time.Time)

	// waking holds the queues whose waiting tasks are being woken, and
	// whether another wake-up was asked for meanwhile (wakeWaiting).
	waking map[string]bool
	// holds holds, per context whose job a Work runs here, the channels
	// that poke its Works (work).
	holds map[int64][]chan struct{}
	// stepSlots and holdSlots bound, per queue, the steps under way: of
	// jobs whose task held its lock at their last step, and of the others
	// (stepInSlot).
	stepSlots, holdSlots map[string]chan struct{}
	// txSlots bound the transactions of the latter: half the pool's
	// connections (step).
	txSlots chan struct{}
	// draining is closed when Run stops: every hold gives its job back.
	draining chan struct{}

	// rescueGrace is how long a running job's client lock must be seen
	// missing before the job's step is rescued (see rescueGraceFor).
	rescueGrace time.Duration
	// rescueMu serializes rescues and guards suspects: for each job seen
	// 'running' without its client's liveness lock, when this supervisor
	// first saw it so. Only the current candidates are kept, so it never
	// holds more entries than there are running jobs.
	rescueMu sync.Mutex
	suspects map[suspect]time.Time
	// begun holds, under mu, the fetches of this client (a job and when it
	// was fetched) that a Work of it began, and when it began: a job running
	// under a fetch of this client that no Work began is a fetch whose
	// answer was lost (rescueOrphanedSteps). An entry goes once a rescue
	// looks and the job no longer runs under that fetch.
	begun map[suspect]time.Time

	metrics *metrics

	// retired is set, and why sent on stop, once the database refused
	// this release's task processes: Run then stops the supervisor.
	retired atomic.Bool
	stop    chan error

	// controls has a token once the listener heard a queue resumed or a
	// kind unblocked (controlLoop).
	controls chan struct{}

	// started is closed once Run works (Started).
	started chan struct{}
}

// Started is closed once Run works: it holds its liveness lock, listens,
// and River fetches its queues' jobs. A service manager or a test waits on
// it rather than on a log line.
func (s *Supervisor) Started() <-chan struct{} { return s.started }

// ErrUnregisteredFunction is returned by New for a configuration whose
// function kinds name a function Options.Funcs lacks.
var ErrUnregisteredFunction = errors.New("unregistered function")

// New returns a supervisor for cfg, given its defaults (cfg itself is left
// as it is); Run starts it.
func New(pool *pgxpool.Pool, cfg *config.Config, opts Options) (*Supervisor, error) {
	cfg = cfg.WithDefaults()
	if err := check(cfg, opts); err != nil {
		return nil, err
	}
	// Checked again at each launch, and by each task process: a
	// directory the operator moved is followed, and one another user
	// controls is refused. A task pod keeps its log in a volume of its
	// own, not here.
	if cfg.Runs(config.RunnerHost) {
		logs, err := logdir.Open(cfg.LogDir, cfg.LogGroup)
		if err != nil {
			return nil, err
		}
		logs.Close()
	}
	prog, err := taskProgram(opts)
	if err != nil {
		return nil, err
	}
	opts.Executable = prog.path
	opts = opts.withDefaults()
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("read host name: %w", err)
	}
	hostID, err := hostproc.ID()
	if err != nil {
		return nil, err
	}
	s := &Supervisor{
		keeperSecret:   []byte(rand.Text()),
		cfg:            cfg,
		opts:           opts,
		program:        prog,
		pool:           pool,
		host:           host,
		hostID:         hostID,
		children:       map[int64]*child{},
		stopping:       map[int64]bool{},
		launchFailures: map[int64]string{},
		spawnFailures:  map[int64]string{},
		pendingStarts:  map[int64]func(time.Time){},
		waking:         map[string]bool{},
		holds:          map[int64][]chan struct{}{},
		stepSlots:      map[string]chan struct{}{},
		holdSlots:      map[string]chan struct{}{},
		txSlots:        make(chan struct{}, max(1, pool.Config().MaxConns/2)),
		draining:       make(chan struct{}),
		orphanSlots:    make(chan struct{}, maxOrphanStoppers),

		metrics: newMetrics(),

		rescueGrace: rescueGraceFor(time.Duration(cfg.PollInterval)),
		suspects:    map[suspect]time.Time{},
		begun:       map[suspect]time.Time{},
		stop:        make(chan error, 1),
		started:     make(chan struct{}),
		controls:    make(chan struct{}, 1),
	}
	s.logger = slog.New(s.outage.Handler(opts.Logger.Handler(), outageGrace, lostTheDatabase))
	s.metrics.zero(cfg)
	if err := s.registerMetrics(); err != nil {
		return nil, err
	}
	if s.river, err = s.newRiverClient(); err != nil {
		return nil, err
	}
	s.submit = submit.New(cfg)
	return s, nil
}

// check refuses, in one line, what a supervisor cannot run: a wrong
// configuration, or options that do not fit it.
func check(cfg *config.Config, opts Options) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if opts.Executable != "" && len(opts.Funcs) > 0 {
		// Another program would find none of the functions: its task
		// processes would be unfit on every host, forever.
		return errors.New("with Options.Funcs, Options.Executable must be empty: the task processes of function kinds are this program")
	}
	if opts.DatabaseURL == "" {
		return errors.New("supervisor needs the database URL to hand to task processes")
	}
	if cfg.Path == "" {
		return errors.New("the configuration names no file (config.Load sets its Path): task processes read it from there")
	}
	if err := checkUsers(cfg); err != nil {
		return err
	}
	if cfg.Runs(config.RunnerKubernetes) && opts.Pods == nil {
		return errors.New("the configuration's kinds run on kubernetes, which this program cannot launch: run dama's image, whose dama is the Kubernetes module's (kubernetes/cmd/dama)")
	}
	for _, name := range cfg.Functions() {
		if opts.Funcs[name] == nil {
			return fmt.Errorf("%w: the configuration's function kinds name %s, which this program does not register (Options.Funcs); run them under the program that does", ErrUnregisteredFunction, name)
		}
	}
	for _, name := range cfg.KindNames() {
		if _, err := cfg.Kinds[name].ScheduleOf(); err != nil {
			return fmt.Errorf("kind %s: %w", name, err)
		}
	}
	return nil
}

// taskProgram opens the program the task processes run
// (Options.Executable, or this one) and checks it.
func taskProgram(opts Options) (*program, error) {
	var (
		prog *program
		err  error
	)
	if opts.Executable != "" {
		prog, err = openProgram(opts.Executable)
	} else {
		prog, err = selfProgram()
	}
	if err != nil {
		return nil, err
	}
	if opts.CheckExecutable != nil && prog.file != nil {
		if err := opts.CheckExecutable(prog.file); err != nil {
			prog.file.Close()
			return nil, err
		}
	}
	return prog, nil
}

// registerMetrics registers the supervisor's metrics with
// Options.Registerer, all or none.
func (s *Supervisor) registerMetrics() error {
	if s.opts.Registerer == nil {
		return nil
	}
	var registered []prometheus.Collector
	for _, c := range append(s.metrics.collectors(), NewPoolCollector(s.pool), NewStatsCollector(s.pool)) {
		if err := s.opts.Registerer.Register(c); err != nil {
			for _, r := range registered {
				s.opts.Registerer.Unregister(r)
			}
			return fmt.Errorf("register metrics: %w", err)
		}
		registered = append(registered, c)
	}
	return nil
}

// newRiverClient makes the River client whose worker steps the tasks.
func (s *Supervisor) newRiverClient() (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &taskWorker{s: s}); err != nil {
		return nil, fmt.Errorf("register task worker: %w", err)
	}
	queues := map[string]river.QueueConfig{}
	for _, name := range s.cfg.QueueNames() {
		// A Work holds the job of each running task (work), on top of the
		// steps: the queue's running tasks, however many of them this
		// supervisor holds, leave room for its steps.
		queues[name] = river.QueueConfig{MaxWorkers: min(s.cfg.Queues[name].MaxRunning+s.opts.MaxWorkers, river.QueueNumWorkersMax)}
		s.stepSlots[name] = make(chan struct{}, s.opts.MaxWorkers)
		s.holdSlots[name] = make(chan struct{}, s.opts.MaxWorkers)
	}
	client, err := river.NewClient(riverpgxv5.New(s.pool), &river.Config{
		Queues:  queues,
		Workers: workers,
		// River reports every retry and snooze at info level; dama logs
		// what matters about a task itself.
		Logger:            slog.New(levelFloor{Handler: s.outage.Handler(s.opts.Logger.Handler(), outageGrace, nil), Min: slog.LevelWarn}),
		FetchCooldown:     s.opts.FetchCooldown,
		FetchPollInterval: s.opts.FetchPollInterval,
		JobTimeout:        stepTimeout(s.opts.LaunchTimeout),
		// dama rescues the steps of dead supervisors itself, within a poll
		// interval and without spending an attempt (rescueOrphanedSteps);
		// River's rescuer is only the last resort.
		RescueStuckJobsAfter: time.Hour,
		// A finished task's job is kept as long as the task, and goes
		// with it (pruneLoop).
		CompletedJobRetentionPeriod: jobRetention(s.cfg, 24*time.Hour),
		CancelledJobRetentionPeriod: jobRetention(s.cfg, 24*time.Hour),
		DiscardedJobRetentionPeriod: jobRetention(s.cfg, 7*24*time.Hour),
	})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return client, nil
}

// Run works tasks until ctx ends, then stops River cleanly: steps in progress
// finish, and task processes are never signalled.
func (s *Supervisor) Run(ctx context.Context) error {
	// The liveness lock comes before River's start: every job River
	// fetches from then on names this client, and others judge it by that
	// lock. It lives on a connection of its own, so that nothing but that
	// connection's failure drops it, and is released only after River has
	// stopped (the deferred stopBackground runs after the River.Stop
	// below). The start waits for a database that restarts or fails over
	// meanwhile (etlcontext.WaitReachable), as one started in a chaos run on a
	// slow machine did not: it exited at "open liveness connection". An
	// older release than the schema, or one whose task processes the
	// database no longer accepts, touches no task.
	var live, l *pglisten.Listener[*pgx.Conn]
	if err := etlcontext.WaitReachable(ctx, s.logger, func() error {
		if err := sql.CheckMigrated(ctx, s.pool); err != nil {
			return err
		}
		if err := etlcontext.CheckRunnerProtocol(ctx, s.pool, protocol.Version); err != nil {
			return err
		}
		// Fresh each try, and closed when the try fails: a supervisor
		// waiting for a full server holds none of its connections meanwhile.
		live, l = s.newLiveness(), s.newListener()
		if err := l.Open(ctx); err != nil {
			return err
		}
		if err := live.Open(ctx); err != nil {
			l.Close(ctx)
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	published := s.publishKinds(ctx)
	s.countAdoptions(ctx)
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	s.mu.Lock()
	s.orphanCtx = bgCtx
	s.mu.Unlock()
	var bg sync.WaitGroup
	bg.Go(func() {
		_ = live.Serve(bgCtx)
		// River has stopped: its last warnings, held for the outage's
		// grace, are written or counted before the count is said.
		s.outage.Flush()
		if muted := s.outage.End(); muted > 0 {
			s.logger.Info("stopped during a database outage", "warnings_muted", muted)
		}
	})
	bg.Go(func() { _ = l.Serve(bgCtx) })
	bg.Go(func() { s.controlLoop(bgCtx) })
	defer func() {
		// Under s.mu: stopOrphans adds to s.orphans only before this.
		s.mu.Lock()
		stopBackground()
		s.mu.Unlock()
		bg.Wait()
		s.orphans.Wait()
	}()

	// Before River starts, so that its own rescuer never gets to the steps
	// of supervisors that died long ago.
	if err := s.rescueOrphanedSteps(ctx); err != nil {
		s.logger.Warn("rescue orphaned steps", "error", err)
	}
	if err := etlcontext.WaitReachable(ctx, s.logger, func() error { return s.river.Start(ctx) }); err != nil {
		return fmt.Errorf("start River client: %w", err)
	}
	s.logger.Info("supervisor started", "host", s.host, "client_id", s.river.ID(), "queues", s.cfg.QueueNames(), "kinds", s.cfg.KindNames(),
		"release", version.Release, "commit", version.Commit(), "protocol", protocol.Version, "task_program", s.opts.Executable)
	close(s.started)
	s.reportOutageTolerance()
	s.reportBudget(ctx)
	s.checkCommands()
	s.checkSharedUsers()
	bg.Go(func() { s.rescueLoop(bgCtx) })
	bg.Go(func() { s.pruneLoop(bgCtx) })
	if p, ok := s.opts.Pods.(Pruner); ok {
		bg.Go(func() { s.pruneLauncherLoop(bgCtx, p) })
	}
	if published != nil {
		bg.Go(func() { s.publishLoop(bgCtx, published) })
	}
	for _, name := range s.cfg.KindNames() {
		k := s.cfg.Kinds[name]
		if sched, _ := k.ScheduleOf(); sched != nil {
			bg.Go(func() { s.scheduleLoop(bgCtx, name, k, sched) })
		}
	}
	var stopErr error
	select {
	case <-ctx.Done():
	case stopErr = <-s.stop:
		s.logger.Error("supervisor stopping", "error", stopErr)
	}

	// Holds give their jobs back at once; steps under way finish.
	close(s.draining)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepTimeout(s.opts.LaunchTimeout))
	defer cancel()
	if err := s.river.Stop(stopCtx); err != nil {
		s.logger.Warn("River did not stop in time; cancelling steps", "error", err)
		hardCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.river.StopAndCancel(hardCtx); err != nil {
			return errors.Join(stopErr, fmt.Errorf("stop River client: %w", err))
		}
	}
	s.logger.Info("supervisor stopped; task processes keep running")
	return stopErr
}

// retire stops the supervisor, once, after the database refused one of its
// task processes: every later launch would be refused too.
func (s *Supervisor) retire(ctx context.Context) {
	if s.retired.Swap(true) {
		return
	}
	err := etlcontext.CheckRunnerProtocol(ctx, s.pool, protocol.Version)
	if !errors.Is(err, etlcontext.ErrProtocolRefused) {
		// The database could not say more (or changed its mind since).
		err = errors.Join(fmt.Errorf("a task process exited with code %d: %w", protocol.ExitRefused, etlcontext.ErrProtocolRefused), err)
	}
	s.stop <- err
}

// countAdoptions counts the tasks running in this supervisor's queues as it
// starts: it adopts them, watching their locks from now on (after a
// redeploy, the tasks that ran through it).
func (s *Supervisor) countAdoptions(ctx context.Context) {
	stats, err := etlcontext.QueueStats(ctx, s.pool)
	if err != nil {
		s.logger.Warn("count the running tasks adopted", "error", err)
		return
	}
	adopted := 0
	for _, st := range stats {
		if st.Queue == nil || st.Kind == nil || st.Running == 0 {
			continue
		}
		if _, ok := s.cfg.Queues[*st.Queue]; ok {
			s.metrics.adopted.WithLabelValues(*st.Queue, *st.Kind).Set(float64(st.Running))
			adopted += int(st.Running)
		}
	}
	if adopted > 0 {
		s.logger.Info("adopting running tasks", "tasks", adopted)
	}
}

// rescueLoop rescues the steps of dead supervisors, reconciles contexts with
// their jobs and watches the running tasks (see watch), every poll
// interval: a constant number of statements, however many tasks run.
func (s *Supervisor) rescueLoop(ctx context.Context) {
	ticker := time.NewTicker(time.Duration(s.cfg.PollInterval))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if err := s.rescueOrphanedSteps(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("rescue orphaned steps", "error", err)
		}
		if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("reconcile contexts with their jobs", "error", err)
		}
		if err := s.watch(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("watch the running tasks", "error", err)
		}
		for _, q := range s.cfg.QueueNames() {
			s.wakeWaiting(ctx, q)
		}
	}
}

// checkUsers refuses, in one line, a kind whose command would run as root
// without the configuration saying so (runas.Resolve), as a user this
// supervisor cannot become, or as one of a group that may read every
// task's log (runas.Identity.Check). Its task processes check again.
func checkUsers(cfg *config.Config) error {
	for _, name := range cfg.KindNames() {
		k, _ := cfg.Kind(name)
		if k.Runner == config.RunnerKubernetes {
			// Its command runs as its container's user.
			continue
		}
		id, err := runas.Resolve(k.User, k.Group)
		if err == nil && id != nil {
			err = id.Check(cfg.LogDir)
		}
		if err != nil {
			return fmt.Errorf("kind %s: %w", name, err)
		}
	}
	return nil
}

// checkSharedUsers logs, in one WARNING, the kinds whose commands run as
// one user where this kernel lets a process trace any other of its user
// (no Yama, or its ptrace_scope 0): a command of one can take another's
// events descriptor (pidfd_getfd) and forge its task's reports. Root's
// kinds are left out: a command run as root can do that whatever Yama
// says, and user: root says so on purpose. (Commands of dama's own user
// can open each other's pipes through /proc whatever Yama says, and do
// more to dama's processes: docs/security.md says to give them users.)
func (s *Supervisor) checkSharedUsers() {
	if scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(scope)) != "0" {
		return
	}
	byUser := map[uint32][]string{}
	for _, name := range s.cfg.KindNames() {
		k := s.cfg.Kinds[name]
		if k.Runner != config.RunnerHost || k.Function != "" {
			continue
		}
		id, err := runas.Resolve(k.User, k.Group)
		uid := uint32(os.Geteuid())
		switch {
		case err != nil:
			continue
		case id != nil:
			uid = id.UID
		}
		if uid != 0 {
			byUser[uid] = append(byUser[uid], name)
		}
	}
	var shared []string
	for _, uid := range slices.Sorted(maps.Keys(byUser)) {
		if kinds := byUser[uid]; len(kinds) > 1 {
			shared = append(shared, fmt.Sprintf("uid %d: %s", uid, strings.Join(kinds, ", ")))
		}
	}
	if len(shared) > 0 {
		s.logger.Warn("kinds share a user, and this kernel lets a process trace another of its user (kernel.yama.ptrace_scope absent or 0): a command of one can forge another's reports; give each kind a user of its own (docs/security.md)",
			"shared", strings.Join(shared, "; "))
	}
}

// checkCommands logs, once per kind, a command this host cannot run: its
// tasks wait, QUEUED, for a host that can (each task process checks again
// at its launch, and records why in a WARNING event).
func (s *Supervisor) checkCommands() {
	for _, name := range s.cfg.KindNames() {
		k, _ := s.cfg.Kind(name)
		if k.Function != "" || k.Runner == config.RunnerKubernetes {
			continue
		}
		if _, err := k.FindCommand(); err != nil {
			s.logger.Error("this host cannot run a kind's command: its tasks wait for a host that can", "kind", name, "error", err)
		}
	}
}
