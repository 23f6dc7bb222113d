package taskrunner

import (
	"io"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/dama-etl/dama/config"
)

// A Starter starts the task's command elsewhere than as the runner's
// child (Options.Starter): the Kubernetes module's starts it in the
// user's container of the task's pod. The runner calls it from one
// goroutine: Attach first, then RetryLock while another process holds
// the lock, Find, Start, and SignalReason while the command runs.
type Starter interface {
	// Attach is called before the lock is taken and before the runner
	// starts any goroutine of its own (it may set the umask), with the runner's
	// options, its logger and the signals it catches (SIGTERM, SIGINT,
	// SIGHUP); false ends the runner with protocol.ExitSetup, nothing
	// recorded: the launch is given back.
	Attach(opts Options, logger *slog.Logger, signals <-chan os.Signal) bool
	// RetryLock returns true when the runner should try the lock again,
	// once it found another process holding it, and false to give up.
	RetryLock() bool
	// Find returns the path of the program of kind's command, where it
	// runs, or why kind (named name) cannot run there.
	Find(name string, kind config.Kind) (string, error)
	// Start starts cmd.
	Start(cmd Command) (*Started, error)
	// SignalReason is why a signal to the runner stops the command.
	SignalReason(sig os.Signal) string
}

// Command is the command a Starter starts.
type Command struct {
	// Argv and Env are its arguments and the environment dama gives it;
	// KillGrace is its kind's kill_grace.
	Argv, Env []string
	KillGrace time.Duration
	// EventsR and EventsW are the events pipe, whose write end the
	// command gets as protocol.EventsFD; the runner reads the other.
	EventsR, EventsW *os.File
	// Output receives what the command prints: the task's log file.
	Output io.Writer
}

// Started is a command a Starter started.
type Started struct {
	// Pid is its process's id, where it runs.
	Pid int
	// Exited receives how it ended, once: nil, or an *ExitError.
	Exited <-chan error
	// Signal sends SIGTERM or SIGKILL to its processes; it is called from
	// a goroutine of its own.
	Signal func(syscall.Signal)
	// Done, called once it exited, returns once its processes are gone
	// and its output copied.
	Done func()
}

// ExitError is how a command a Starter started ended, but for a success.
type ExitError struct {
	Status syscall.WaitStatus
	// Detail, when set, follows the description of the exit.
	Detail string
}

func (e *ExitError) Error() string { return describeStatus(e.Status) + e.Detail }
