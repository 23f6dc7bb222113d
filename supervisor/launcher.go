package supervisor

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/protocol"
)

// A Launcher starts the task processes of the kinds of one runner
// (config.Kind.Runner) and answers, for their attempts, what the task's
// lock does not say. A supervisor launches its host kinds' itself; a
// program gives it the launcher of its kubernetes kinds (Options.Pods: the
// Kubernetes module's runs each attempt in a pod of its own).
//
// The supervisor steps every task through its lock, wherever its task
// process runs: a launcher is asked only whether a launch whose task
// process has not taken the lock yet may still take it (Starting), and
// whether every process of an attempt whose lock is free is surely gone
// (Gone), which lets the next attempt start before the fencing window has
// passed.
type Launcher interface {
	// Launch starts the task process of l. It may return before the
	// process holds the task's lock (LaunchPending); the supervisor then
	// learns it from the lock.
	Launch(ctx context.Context, l Launch) (LaunchOutcome, error)
	// Starting decides a launch of c whose task process recorded no start
	// and whose lock is free: Hold while it may still start, else, having
	// made sure it never will, why it did not. failed is why this
	// supervisor's Launch of it returned an error, if it did; cancel that
	// the task is to be cancelled, which needs no wait.
	Starting(ctx context.Context, c *etlcontext.Context, failed string, cancel bool) (Start, error)
	// Gone tells whether every process of c's current attempt, whose lock
	// is free, is surely gone (GoneSurely), surely not (GoneNot), or
	// cannot be told here (GoneUnknown: the fencing window is waited
	// out), and what the launcher knows of its end, in its words.
	Gone(ctx context.Context, c *etlcontext.Context) (Gone, string)
	// Finished is told that c, a task of its kinds, is finished (whoever
	// launched it: adopted tasks too): what is left of its last attempt
	// may go.
	Finished(ctx context.Context, c *etlcontext.Context)
}

// Launch is an attempt of a task to launch.
type Launch struct {
	Task *etlcontext.Context
	Run  etlcontext.Run
	// Secrets are what its task process reads first: the database's
	// address and credentials and the run's key.
	Secrets protocol.Secrets
	// Logger logs the launch, with the step's attributes.
	Logger *slog.Logger
}

// LaunchOutcome is what a Launch found.
type LaunchOutcome int

const (
	// LaunchPending: the task process has not taken its lock yet; it may
	// (a pod's launcher's only outcome).
	LaunchPending LaunchOutcome = iota
	// LaunchReady: the task process holds the lock and runs the command.
	LaunchReady
	// LaunchLocked: the task process found another holding the lock.
	LaunchLocked
	// LaunchExited: the task process exited before holding its lock.
	LaunchExited
	// LaunchRefused: the database no longer accepts this release's task
	// processes (protocol.ExitRefused).
	LaunchRefused
)

// Start is what Starting decided.
type Start struct {
	// Hold: the task process may still start; look again later.
	Hold bool
	// Why it did not start, for the task's WARNING; empty when there is
	// nothing to tell. WhyIfUntold: only if its task process said nothing.
	Why         string
	WhyIfUntold bool
	// Again is how long to wait before the next launch; 0: the poll interval.
	Again time.Duration
}

// Gone is what a Launcher knows of whether an attempt's processes are gone.
type Gone int

const (
	// GoneUnknown: the launcher cannot tell.
	GoneUnknown Gone = iota
	// GoneNot: some process of the attempt still runs.
	GoneNot
	// GoneSurely: every process of the attempt is gone.
	GoneSurely
)

// launcherOf returns the launcher of c's kind.
func (s *Supervisor) launcherOf(c *etlcontext.Context) Launcher {
	if k, ok := s.cfg.Kind(c.Kind); ok && k.Runner == config.RunnerKubernetes && s.opts.Pods != nil {
		return s.opts.Pods
	}
	return hostLauncher{s}
}

// hostLauncher runs task processes on this host.
type hostLauncher struct{ s *Supervisor }

// Starting: a host's launch is over once Launch returned.
func (h hostLauncher) Starting(_ context.Context, _ *etlcontext.Context, failed string, _ bool) (Start, error) {
	return Start{Why: failed}, nil
}

// Gone reads the processes of an attempt that ran on this host (its task
// process, and every process its command started), and stops those that
// remain. Another host's attempt is GoneUnknown.
func (h hostLauncher) Gone(ctx context.Context, c *etlcontext.Context) (Gone, string) {
	s := h.s
	if c.HostID == nil || *c.HostID != s.hostID || c.RunnerStartTicks == nil {
		return GoneUnknown, ""
	}
	alive, err := hostproc.Alive(*c.PID, uint64(*c.RunnerStartTicks))
	if err != nil {
		s.logger.Warn("read task process; counting it alive", "etl_context_id", c.ID, "pid", *c.PID, "error", err)
	}
	if alive {
		return GoneNot, ""
	}
	if gone := s.emptyGroup(ctx, c); gone != GoneSurely {
		return gone, ""
	}
	// Even with a group: a command of dama's own user may write the groups
	// above its own, and leave it.
	procs, err := s.attemptProcesses(c).Processes()
	if err != nil {
		s.logger.Warn("look for the processes of a dead attempt; counting them alive", "etl_context_id", c.ID, "error", err)
		return GoneNot, ""
	}
	if len(procs) > 0 {
		s.stopOrphans(c.ID)
		return GoneNot, ""
	}
	return GoneSurely, ""
}

// Finished: nothing of a host's attempt outlives it.
func (hostLauncher) Finished(context.Context, *etlcontext.Context) {}

// startedLate counts the attempt of task id launched here started, once,
// at at; with at nil, it forgets the launch (taken back) without counting it.
func (s *Supervisor) startedLate(id int64, at *time.Time) {
	s.mu.Lock()
	started, ok := s.pendingStarts[id]
	delete(s.pendingStarts, id)
	s.mu.Unlock()
	if ok && at != nil {
		started(*at)
	}
}

// finished tells c's launcher that c is finished, and forgets its launch.
func (s *Supervisor) finished(ctx context.Context, c *etlcontext.Context) {
	var at *time.Time
	if c.PID != nil {
		at = cmp.Or(c.ProcessStartedAt, new(time.Now()))
	}
	s.startedLate(c.ID, at)
	s.launcherOf(c).Finished(ctx, c)
}

// A Pruner is a Launcher that deletes, every minute, what its attempts
// left past their retention (finished pods).
type Pruner interface {
	Prune(ctx context.Context) error
}

// launcherPruneEvery is how often a Pruner prunes.
const launcherPruneEvery = time.Minute

// pruneLauncher returns what prunes what p's attempts left.
func (s *Supervisor) pruneLauncher(p Pruner) func(context.Context) {
	return func(ctx context.Context) {
		if err := p.Prune(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.logger.Warn("delete what finished attempts left past their retention", "error", err)
		}
	}
}
