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
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/cgroup"
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
// so dama's are tighter than River's own (100ms and 1s). River sends one
// insert notification per queue per FetchCooldown from a client at most:
// River's would leave the tasks of a burst waiting for the next fetch poll.
const (
	defaultFetchCooldown     = 10 * time.Millisecond
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
	// submit submits the tasks of periodic kinds' ticks.
	submit *submit.Submitter
	// logger is Options.Logger, muted during an outage of the database.
	logger *slog.Logger
	outage outageMuter
	host   string
	hostID string
	// keeperSecret is what its task processes and their host's lock keeper
	// prove to each other (internal/keeper); naming the keeper's socket, it
	// gives each supervisor's task processes a keeper of their own.
	keeperSecret []byte
	// fence times the fencing windows of attempts on other hosts.
	fence   fenceClock
	metrics *metrics
	// groups is where this host's attempts get a control group each
	// (hostGroups); nil where there is none.
	groups *cgroup.Tree

	mu       sync.Mutex
	children map[int64]*child
	// stopping holds the contexts whose orphans are being stopped
	// (stopOrphans); orphanCtx is nil outside Run.
	stopping    map[int64]bool
	orphans     sync.WaitGroup
	orphanCtx   context.Context
	orphanSlots chan struct{}
	// launchFailures holds the last failed launch reported per context
	// (reportLaunchFailure); spawnFailures why this supervisor could not
	// spawn a context's task process, until it is reported.
	launchFailures, spawnFailures map[int64]string
	pendingStarts                 map[int64]func(time.Time) // see startedLate
	waking                        map[string]bool           // see wakeWaiting
	holds                         map[int64][]chan struct{} // see work
	unfit                         map[string]unfitKind      // see cannotRunNow
	// stepSlots and holdSlots bound each queue's steps under way
	// (stepInSlot); txSlots the transactions of the former (step).
	stepSlots, holdSlots map[string]chan struct{}
	txSlots              chan struct{}
	// draining is closed when Run stops: every hold gives its job back.
	draining chan struct{}

	// rescueMu serializes rescues (rescueOrphanedSteps) and guards suspects;
	// begun (under mu) holds the fetches of this client a Work began.
	rescueGrace time.Duration
	rescueMu    sync.Mutex
	suspects    map[suspect]time.Time
	begun       map[suspect]time.Time

	// retired is set, and why sent on stop, once the database refused
	// this release's task processes (retire).
	retired  atomic.Bool
	stop     chan error
	controls chan struct{} // see controlLoop
	started  chan struct{} // see Started
}

// Started is closed once Run works: it holds its liveness lock, listens,
// and River fetches its queues' jobs. A service manager or a test waits on
// it rather than on a log line. By then it is in data_manager.supervisors.
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
	// Checked again at each launch, and by each task process. A task pod
	// keeps its log in a volume of its own, not here.
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
	groups, err := hostGroups(cfg, opts.Logger)
	if err != nil {
		return nil, err
	}
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
		groups:         groups,
		children:       map[int64]*child{},
		stopping:       map[int64]bool{},
		launchFailures: map[int64]string{},
		spawnFailures:  map[int64]string{},
		unfit:          map[string]unfitKind{},
		pendingStarts:  map[int64]func(time.Time){},
		waking:         map[string]bool{},
		holds:          map[int64][]chan struct{}{},
		stepSlots:      map[string]chan struct{}{},
		holdSlots:      map[string]chan struct{}{},
		txSlots:        make(chan struct{}, max(1, pool.Config().MaxConns/2)),
		draining:       make(chan struct{}),
		orphanSlots:    make(chan struct{}, maxOrphanStoppers),
		metrics:        newMetrics(),
		rescueGrace:    rescueGraceFor(time.Duration(cfg.PollInterval)),
		suspects:       map[suspect]time.Time{},
		begun:          map[suspect]time.Time{},
		stop:           make(chan error, 1),
		started:        make(chan struct{}),
		controls:       make(chan struct{}, 1),
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

// check refuses a configuration, or options, that a supervisor cannot run.
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
	if opts.Executable == "" {
		return selfProgram()
	}
	prog, err := openProgram(opts.Executable)
	if err != nil {
		return nil, err
	}
	if opts.CheckExecutable != nil {
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
	all := append(s.metrics.collectors(), NewPoolCollector(s.pool), NewStatsCollector(s.pool))
	for i, c := range all {
		if err := s.opts.Registerer.Register(c); err != nil {
			for _, r := range all[:i] {
				s.opts.Registerer.Unregister(r)
			}
			return fmt.Errorf("register metrics: %w", err)
		}
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
		// A Work holds the job of each running task (work): however many
		// this supervisor holds, they leave room for its steps.
		queues[name] = river.QueueConfig{MaxWorkers: min(s.cfg.Queues[name].MaxRunning+s.opts.MaxWorkers, river.QueueNumWorkersMax)}
		s.stepSlots[name] = make(chan struct{}, s.opts.MaxWorkers)
		s.holdSlots[name] = make(chan struct{}, s.opts.MaxWorkers)
	}
	client, err := river.NewClient(riverpgxv5.New(s.pool), &river.Config{
		Queues:  queues,
		Workers: workers,
		// River reports every retry and snooze at info level; dama logs
		// what matters about a task itself.
		Logger: slog.New(levelFloor{Handler: riverTail{Handler: s.outage.Handler(s.opts.Logger.Handler(), outageGrace, nil), o: &s.outage, tail: outageTail},
			Min: slog.LevelWarn}),
		FetchCooldown:     s.opts.FetchCooldown,
		FetchPollInterval: s.opts.FetchPollInterval,
		JobTimeout:        stepTimeout(s.opts.LaunchTimeout),
		// dama rescues the steps of dead supervisors itself
		// (rescueOrphanedSteps); River's rescuer is only the last resort.
		RescueStuckJobsAfter: time.Hour,
		// A finished task's job goes with the task (prune).
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
	// The liveness lock comes before River's start, as every job River
	// fetches names this client and others judge it by that lock, and is
	// released after River stopped (the deferred stopBackground). The start
	// waits for a database that restarts or fails over meanwhile: one
	// started in a chaos run on a slow machine exited at "open liveness
	// connection".
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
	// of supervisors that died long ago; and before serves, which deletes
	// the row of a supervisor of this host that is gone, by which this look
	// takes up its steps at once (diedHere).
	if err := s.rescueOrphanedSteps(ctx); err != nil {
		s.logger.Warn("look for tasks whose supervisor stopped looking after them", "error", err)
	}
	if err := etlcontext.WaitReachable(ctx, s.logger, func() error { return s.river.Start(ctx) }); err != nil {
		return fmt.Errorf("start River client: %w", err)
	}
	s.logger.Info("supervisor started", "host", s.host, "client_id", s.river.ID(), "queues", s.cfg.QueueNames(), "kinds", s.cfg.KindNames(),
		"release", version.Release, "commit", version.Commit(), "protocol", protocol.Version, "task_program", s.opts.Executable)
	s.serves(ctx)
	close(s.started)
	s.reportOutageTolerance()
	s.reportBudget(ctx)
	s.checkCommands()
	s.checkSharedUsers()
	if s.groups != nil {
		bg.Go(func() { s.sweepGroups(bgCtx) })
	}
	bg.Go(func() { every(bgCtx, time.Duration(s.cfg.PollInterval), s.tend) })
	bg.Go(func() {
		for sleep(bgCtx, servesEvery) {
			s.serves(bgCtx)
		}
	})
	if s.cfg.Retention >= 0 {
		bg.Go(func() { every(bgCtx, pruneEvery(s.cfg), s.prune) })
	}
	if p, ok := s.opts.Pods.(Pruner); ok {
		bg.Go(func() { every(bgCtx, launcherPruneEvery, s.pruneLauncher(p)) })
	}
	bg.Go(func() { s.publishLoop(bgCtx, published) })
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

	close(s.draining)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stepTimeout(s.opts.LaunchTimeout))
	defer cancel()
	if err := s.river.Stop(stopCtx); err != nil {
		s.logger.Warn("the work in hand on tasks did not end in time; cutting it short (their task processes keep running)", "error", err)
		hardCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := s.river.StopAndCancel(hardCtx); err != nil {
			return errors.Join(stopErr, fmt.Errorf("stop River client: %w", err))
		}
	}
	s.stopsServing(ctx)
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
// starts, which it adopts.
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

// every calls f now and then every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func(context.Context)) {
	ticker := time.NewTicker(d)
	defer ticker.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// tend rescues the steps of dead supervisors, reconciles contexts with
// their jobs, watches the running tasks and wakes the waiting ones, every
// poll interval: a constant number of statements, however many tasks run.
func (s *Supervisor) tend(ctx context.Context) {
	if err := s.rescueOrphanedSteps(ctx); err != nil && ctx.Err() == nil {
		s.logger.Warn("look for tasks whose supervisor stopped looking after them", "error", err)
	}
	if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
		s.logger.Warn("check that each task's River job agrees with the task", "error", err)
	}
	if err := s.watch(ctx); err != nil && ctx.Err() == nil {
		s.logger.Warn("watch the running tasks", "error", err)
	}
	for _, q := range s.cfg.QueueNames() {
		s.wakeWaiting(ctx, q)
	}
}

// checkUsers refuses a kind whose command would run as root without the
// configuration saying so (runas.Resolve), as a user this supervisor cannot
// become, or in a group that may read every task's log
// (runas.Identity.Check). Its task processes check again.
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
// kinds are left out: root can do that whatever Yama says, and user: root
// says so on purpose.
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

// checkCommands logs, once per kind, a command this host cannot run, or
// its user may not: its tasks wait, QUEUED, for a host that can (each task
// process checks again).
func (s *Supervisor) checkCommands() {
	for _, name := range s.cfg.KindNames() {
		if err := cannotRun(s.cfg.Kinds[name]); err != nil {
			s.logger.Error("this host cannot run a kind's command: its tasks wait for a host that can", "kind", name, "error", err)
		}
	}
}

// unfitKind is whether this host could run a kind's command when it last
// looked, and when that was.
type unfitKind struct {
	unfit bool
	at    time.Time
}

// cannotRunNow reports whether this host cannot run kind name's command
// (cannotRun), looking once per poll_interval: the look costs 0.06-0.33 ms
// of CPU, a thread of its own for a kind with a user, and a start looks at
// every launch. A change is seen within a poll_interval; a task process
// that finds the command gone meanwhile says so.
func (s *Supervisor) cannotRunNow(name string, k config.Kind) bool {
	s.mu.Lock()
	u, ok := s.unfit[name]
	s.mu.Unlock()
	if ok && time.Since(u.at) < time.Duration(s.cfg.PollInterval) {
		return u.unfit
	}
	u = unfitKind{unfit: cannotRun(k) != nil, at: time.Now()}
	s.mu.Lock()
	s.unfit[name] = u
	s.mu.Unlock()
	return u.unfit
}

// cannotRun says why this host cannot run kind k's command, as its task
// processes would find: nil for one it can, or whose command runs elsewhere.
func cannotRun(k config.Kind) error {
	if k.Function != "" || k.Runner == config.RunnerKubernetes {
		return nil
	}
	path, err := k.FindCommand()
	if err == nil {
		// checkUsers let the supervisor start: Resolve and Check agree.
		if id, _ := runas.Resolve(k.User, k.Group); id != nil {
			err = id.CanRun(path)
		}
	}
	return err
}
