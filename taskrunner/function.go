package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/task"
)

// Func is the body of a function kind: it runs one attempt of a task, in a
// process of its own (see RunFunction), and returns nil when the task is
// done; an error fails the attempt, retried unless it is NoRetry's. ctx is
// cancelled when dama stops the attempt (cancelled, timed out, lock lost);
// a function that does not return then is killed after the kind's
// kill_grace, like a command.
type Func func(ctx context.Context, t *Task) error

// Funcs maps the names that kinds give in their `function` setting to functions.
type Funcs map[string]Func

// NoRetry marks err as final: it fails its task for good, whatever attempts remain.
func NoRetry(err error) error {
	if err == nil {
		return nil
	}
	return noRetryError{err}
}

type noRetryError struct{ err error }

func (e noRetryError) Error() string { return e.err.Error() }
func (e noRetryError) Unwrap() error { return e.err }

// Task is what a function gets of its task: its arguments and last
// checkpoint, and the means to report progress, checkpoints, events and
// children, exactly as a command's program does with package task; what it
// reports is recorded only while this attempt is the task's current one.
type Task = task.Task

// RunFunction is the main of a function process, which a runner of a
// function kind starts from its own program (supervisor.RunTaskProcess
// calls this). It calls the function protocol.FunctionEnv names with a Task
// from the environment, and returns the exit code: 0 when it returned nil;
// 1 when it returned an error, reported to the runner first; 2 when it
// panicked. Whatever the function does (block in a system call, ignore ctx,
// call os.Exit), the runner stops it like any command, holding the lock.
func RunFunction(ctx context.Context, funcs Funcs) int {
	name := os.Getenv(protocol.FunctionEnv)
	t, err := task.FromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dama: function %s: %v\n", name, err)
		return 1
	}
	// What this process starts is not the task: it gets none of the task's
	// environment but DAMA_RUN_ID, by which the runner finds it.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "DAMA_") && name != protocol.RunIDEnv {
			os.Unsetenv(name)
		}
	}
	fn := funcs[name]
	if fn == nil {
		// The runner checked that its program registers the function; it
		// runs the same program.
		err := fmt.Errorf("function %q is not registered in this program", name)
		_ = t.Fail(err.Error(), false)
		fmt.Fprintln(os.Stderr, "dama:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	panicked, err := call(ctx, fn, t)
	if err == nil {
		return 0
	}
	if ferr := t.Fail(err.Error(), !errors.As(err, new(noRetryError))); ferr != nil {
		fmt.Fprintln(os.Stderr, "dama:", ferr)
	}
	if panicked {
		return 2
	}
	fmt.Fprintf(os.Stderr, "dama: function %s: %v\n", name, err)
	return 1
}

// call runs fn, turning a panic in its goroutine into an error with the
// stack written to the log (a panic in a goroutine fn started still ends
// the process, with exit code 2).
func call(ctx context.Context, fn Func, t *Task) (panicked bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			fmt.Fprintf(os.Stderr, "panic: %v\n\n%s", v, debug.Stack())
			panicked, err = true, fmt.Errorf("panic: %v", v)
			if site := panicSite(); site != "" {
				// The log's tail may have lost the top of a deep stack.
				err = fmt.Errorf("panic: %v (at %s)", v, site)
			}
		}
	}()
	return false, fn(ctx, t)
}

// panicSite names the function and line that panicked: the first frame
// below the runtime's panic machinery, called from the deferred recover.
func panicSite() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") && f.Function != "" {
			return fmt.Sprintf("%s %s:%d", f.Function, f.File, f.Line)
		}
		if !more {
			return ""
		}
	}
}
