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
	// DatabaseURL is what task processes connect with, handed to them on
	// their secrets socket: the supervisor's own, or one of a member of the
	// role dama_task (least privilege). Required.
	DatabaseURL string
	// Executable is the program task processes run: cmd/dama-taskrunner,
	// the smallest, or a dama binary (`dama taskrunner`). Empty means the
	// binary this process started from, as must a program that registers
	// Funcs. Either is the file there when New ran, even after the file at
	// its path was replaced by a rename (a redeploy): task processes are of
	// the release the supervisor checked the schema for. A named program
	// must be readable; one written in place since is refused at each
	// launch, and a script (#!) is run from its path.
	Executable string
	// CheckExecutable, when set, is called by New with the program it
	// opened (Executable, when set): an error refuses it, and New returns
	// it. `dama supervisor` checks there that dama-taskrunner is of its own
	// build.
	CheckExecutable func(program *os.File) error
	// Funcs are the functions of the configuration's function kinds (a
	// kind's `function` setting names one); New refuses a configuration
	// naming a function missing here.
	Funcs taskrunner.Funcs
	// Logger receives the supervisor's logs; nil means slog.Default().
	Logger *slog.Logger
	// LaunchTimeout bounds how long a step waits for a spawned runner to
	// take its lock; zero means 10s.
	LaunchTimeout time.Duration
	// FetchCooldown and FetchPollInterval tune River's fetching; zero means
	// dama's defaults (10ms and 250ms), tighter than River's own.
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	// MaxWorkers bounds concurrent steps per queue on this supervisor, and
	// as many again those of running tasks' held jobs; zero means 32. River
	// runs up to the queue's max_running plus MaxWorkers jobs of a queue
	// here (at most 10,000): a running task's held job takes no step.
	MaxWorkers int
	// Registerer, when set, receives the supervisor's Prometheus metrics
	// (dama_*), its pool's (NewPoolCollector) and the database's statistics
	// (NewStatsCollector): one supervisor per registry. An untyped nil (a
	// nil *prometheus.Registry is not one) means none are registered.
	Registerer prometheus.Registerer
	// Pods launches the tasks of the configuration's kubernetes kinds
	// (config.RunnerKubernetes): the Kubernetes module's launcher, in its
	// dama. nil refuses a configuration with such kinds.
	Pods Launcher
}

// withDefaults is o with every field left unset given its default.
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
