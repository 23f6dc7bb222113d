package supervisor

import (
	"cmp"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dama-etl/dama/taskrunner"
)

// Options tune a Supervisor beyond its configuration file.
type Options struct {
	// DatabaseURL is what task processes connect with, handed to them in
	// their environment: the supervisor's own, or one of a member of the
	// role dama_task (least privilege). Required.
	DatabaseURL string
	// Executable is the program task processes run: cmd/dama-taskrunner,
	// the smallest, or a dama binary (`dama taskrunner`). Empty means the
	// binary this process started from, even after the file at its path
	// was replaced (a redeploy): task processes are of the release the
	// supervisor checked the schema for. A named program is opened by New
	// (it must be readable), and the file opened is what task processes
	// run, even after the file at the path was replaced by a rename; one
	// written in place since is refused at each launch. A script (#!) is
	// run from its path as it is at each launch. A program that registers
	// Funcs leaves it empty: its task processes are itself (see
	// RunTaskProcess).
	Executable string
	// CheckExecutable, when set, is called by New with the program it
	// opened (Executable, when set), before it is used: an error refuses
	// it, and New returns the error. `dama supervisor` checks there that
	// dama-taskrunner is of its own build. nil means no check.
	CheckExecutable func(program *os.File) error
	// Funcs are the functions of the configuration's function kinds (a
	// kind's `function` setting names one); New refuses a configuration
	// naming a function missing here. nil means none: the dama binary
	// runs command kinds only.
	Funcs taskrunner.Funcs
	// Logger receives the supervisor's logs; nil means slog.Default().
	Logger *slog.Logger
	// LaunchTimeout bounds how long a step waits for a spawned runner to
	// take its lock; zero means 10s.
	LaunchTimeout time.Duration
	// FetchCooldown and FetchPollInterval tune River's fetching; zero means
	// dama's defaults (10ms and 250ms), tighter than River's own (100ms and
	// 1s) because every task start and finish goes through a fetch.
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	// MaxWorkers bounds concurrent steps per queue on this supervisor, and
	// as many again those of running tasks' held jobs; zero means 32. The
	// transactions of the former, in which a start waits its turn at its
	// queue's lock, take at most half of the pool's connections, whatever
	// the queues. A running task's job takes no step while it waits: River
	// runs up to the queue's max_running plus MaxWorkers jobs of a queue
	// here (at most 10,000).
	MaxWorkers int
	// Registerer, when set, receives the supervisor's Prometheus metrics
	// (dama_attempts_*, dama_tasks_finished_total, dama_task_run_seconds,
	// dama_submit_to_lock_seconds, dama_adopted_tasks,
	// dama_lock_losses_total, dama_reconnects_total,
	// dama_step_errors_total), its pool's (dama_pool_*) and the
	// database's statistics (NewStatsCollector): one supervisor per
	// registry. nil (an untyped nil: a nil *prometheus.Registry is not
	// one) means none are registered.
	Registerer prometheus.Registerer
	// Pods launches the tasks of the configuration's kubernetes kinds
	// (config.RunnerKubernetes), each attempt in a pod of its own: the
	// Kubernetes module's launcher, in its dama. nil refuses a
	// configuration with such kinds.
	Pods Launcher
}

// withDefaults is o with every field left unset given its default, as each
// field's comment says.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.LaunchTimeout = cmp.Or(o.LaunchTimeout, 10*time.Second)
	o.FetchCooldown = cmp.Or(o.FetchCooldown, defaultFetchCooldown)
	o.FetchPollInterval = cmp.Or(o.FetchPollInterval, defaultFetchPollInterval)
	o.MaxWorkers = cmp.Or(o.MaxWorkers, 32)
	return o
}
