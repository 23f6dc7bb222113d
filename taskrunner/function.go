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
// process of its own that the task's runner started (see RunFunction), and
// returns nil when the task is done. A returned error fails the attempt,
// retried under the kind's retry policy unless it is NoRetry's.
//
// ctx is cancelled when dama stops the attempt: the task is cancelled, its
// timeout passed, its lock was lost, or its runner was signalled. A
// function that does not return then is killed with its process group
// after the kind's kill_grace, like a command.
type Func func(ctx context.Context, t *Task) error

// Funcs maps the names that kinds give in their `function` setting to
// their functions.
type Funcs map[string]Func

// NoRetry marks err as final: a function that returns it fails its task for
// good, whatever attempts remain.
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
// children, exactly as a command's program does with package task. What it
// reports goes to the task process on the events pipe, and is recorded
// only while this attempt is the task's current one.
type Task = task.Task

// RunFunction is the main of a function process: a runner of a function
// kind starts its own program again with protocol.ProcessEnv set to protocol.ProcessFunction,
// and supervisor.RunTaskProcess calls this. It calls the function
// protocol.FunctionEnv names with a Task read from the environment, and returns the
// process's exit code: 0 when the function returned nil; 1 when it
// returned an error, which it reports to the runner first; 2 when it
// panicked.
//
// The function runs in a process of its own, not in the runner, so that
// whatever it does (block in a system call, ignore ctx, call os.Exit, leave
// goroutines or processes behind) the runner stops it like any command and
// records the outcome, holding the lock throughout.
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
	var final noRetryError
	retry := !errors.As(err, &final)
	if ferr := t.Fail(err.Error(), retry); ferr != nil {
		fmt.Fprintln(os.Stderr, "dama:", ferr)
	}
	if panicked {
		return 2
	}
	fmt.Fprintf(os.Stderr, "dama: function %s: %v\n", name, err)
	return 1
}

// call runs fn, turning a panic in its goroutine into an error with the
// stack written to the log. A panic in a goroutine fn started still ends
// the process, with exit code 2 and the stack in the log.
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

// panicSite names the function and line that panicked, called from the
// deferred function that recovered: the first frame below the runtime's
// panic machinery.
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
