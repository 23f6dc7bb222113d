package taskrunner

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/dama-etl/dama/etlcontext"
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
// children. What it reports goes to the runner on the events pipe, exactly
// as a command's lines do, and is recorded only while this attempt is the
// task's current one. Its methods are safe for concurrent use. A method
// fails when its report is invalid (a reserved event type, a checkpoint
// too large) or cannot reach the runner (it is gone); nil means the runner
// got the report, not that it was recorded: what the database refuses (a
// child of an unknown kind, say) is recorded as a WARNING event instead.
type Task struct {
	id      int64
	kind    string
	attempt int
	args    json.RawMessage
	last    json.RawMessage
	logger  *slog.Logger

	mu     sync.Mutex
	events *os.File
}

// ID returns the task's etl_context_id.
func (t *Task) ID() int64 { return t.id }

// Kind returns the task's kind.
func (t *Task) Kind() string { return t.kind }

// Attempt returns the attempt this process runs, from 1.
func (t *Task) Attempt() int { return t.attempt }

// Args returns the task's arguments, a JSON object.
func (t *Task) Args() json.RawMessage { return t.args }

// DecodeArgs decodes the task's arguments into v, as json.Unmarshal does.
func (t *Task) DecodeArgs(v any) error {
	if err := json.Unmarshal(t.args, v); err != nil {
		return fmt.Errorf("decode arguments of task %d: %w", t.id, err)
	}
	return nil
}

// LastCheckpoint returns the payload of the task's latest CHECKPOINT event
// of an earlier attempt, nil when there is none: an attempt resumes from
// it.
func (t *Task) LastCheckpoint() json.RawMessage { return t.last }

// DecodeLastCheckpoint decodes the latest checkpoint into v, as
// json.Unmarshal does, and reports whether there was one.
func (t *Task) DecodeLastCheckpoint(v any) (bool, error) {
	if t.last == nil {
		return false, nil
	}
	if err := json.Unmarshal(t.last, v); err != nil {
		return false, fmt.Errorf("decode last checkpoint of task %d: %w", t.id, err)
	}
	return true, nil
}

// Logger returns a logger that writes to the task's log file.
func (t *Task) Logger() *slog.Logger { return t.logger }

// Progress reports how far along the task is, a PROGRESS event: {"step":
// 3, "of": 10} or {"percent": 30} draw a bar in dama's views.
func (t *Task) Progress(v any) error {
	return t.send(etlcontext.EventProgress, v, 0)
}

// Checkpoint records where a later attempt may resume from, a CHECKPOINT
// event: at most MaxEnvPayload bytes of JSON.
func (t *Task) Checkpoint(v any) error {
	return t.send(etlcontext.EventCheckpoint, v, MaxEnvPayload)
}

// Event records an event of the task's own type (letters, digits and '_';
// stored upper-cased as <kind>:<TYPE>). The types dama writes itself, and
// "submit" and "failure", are refused.
func (t *Task) Event(eventType string, v any) error {
	suffix := strings.ToUpper(eventType)
	switch {
	case !suffixRE.MatchString(suffix):
		return fmt.Errorf("event type %q: want letters, digits and '_', starting with a letter", eventType)
	case reservedSuffixes[suffix] || suffix == submitType || suffix == failureType:
		return fmt.Errorf("event type %q is reserved for dama", eventType)
	}
	return t.send(suffix, v, 0)
}

// Submit submits a child task of the given kind, a kind of the runner's
// configuration. With an idempotency key, a later attempt submitting the
// same key gets the same child rather than a second one; without one,
// each call submits a child. The child is created once the runner records
// the submission, in the transaction of a SUBMITTED event that names it;
// a kind with await_children waits for it after the function returns.
func (t *Task) Submit(kind string, args any, idempotencyKey string) error {
	if kind == "" {
		return errors.New("submit a child: kind is required")
	}
	c := Child{Kind: kind, IdempotencyKey: idempotencyKey}
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return fmt.Errorf("submit a child: encode arguments: %w", err)
		}
		if len(b) > MaxEnvPayload {
			return fmt.Errorf("submit a child: arguments of %d bytes exceed the %d bytes a task receives", len(b), MaxEnvPayload)
		}
		c.Args = b
	}
	return t.send(submitType, c, 0)
}

// send writes one line on the events pipe; limit, when above 0, bounds the
// payload's size.
func (t *Task) send(suffix string, v any, limit int) error {
	what := strings.ToLower(suffix)
	payload, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("report %s: encode payload: %w", what, err)
	}
	if limit > 0 && len(payload) > limit {
		return fmt.Errorf("report %s: payload of %d bytes exceeds %d bytes", what, len(payload), limit)
	}
	line, err := json.Marshal(struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}{what, payload})
	if err != nil {
		return fmt.Errorf("report %s: %w", what, err)
	}
	if len(line) >= MaxEventLine {
		return fmt.Errorf("report %s: line of %d bytes exceeds %d bytes", what, len(line), MaxEventLine)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := t.events.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("report %s: %w", what, err)
	}
	return nil
}

// RunFunction is the main of a function process: a runner of a function
// kind starts its own program again with ProcessEnv set to ProcessFunction,
// and supervisor.RunTaskProcess calls this. It calls the function
// FunctionEnv names with a Task read from the environment, and returns the
// process's exit code: 0 when the function returned nil; 1 when it
// returned an error, which it reports to the runner first; 2 when it
// panicked.
//
// The function runs in a process of its own, not in the runner, so that
// whatever it does (block in a system call, ignore ctx, call os.Exit, leave
// goroutines or processes behind) the runner stops it like any command and
// records the outcome, holding the lock throughout.
func RunFunction(ctx context.Context, funcs Funcs) int {
	name := os.Getenv(FunctionEnv)
	t, err := taskFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dama: function %s: %v\n", name, err)
		return 1
	}
	// What this process starts is not the task: it gets none of the task's
	// environment but DAMA_RUN_ID, by which the runner finds it.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "DAMA_") && name != RunIDEnv {
			os.Unsetenv(name)
		}
	}
	fn := funcs[name]
	if fn == nil {
		// The runner checked that its program registers the function; it
		// runs the same program.
		err := fmt.Errorf("function %q is not registered in this program", name)
		_ = t.fail(err, false)
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
	if ferr := t.fail(err, retry); ferr != nil {
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

// fail reports why the function failed, a failure line.
func (t *Task) fail(err error, retry bool) error {
	return t.send(failureType, Failure{Error: truncateUTF8(err.Error(), MaxFailureError), Retry: &retry}, 0)
}

// taskFromEnv reads the task a runner handed to its function process.
func taskFromEnv() (*Task, error) {
	id, err := strconv.ParseInt(os.Getenv("DAMA_ETL_CONTEXT_ID"), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("DAMA_ETL_CONTEXT_ID: %w", err)
	}
	attempt, err := strconv.Atoi(os.Getenv("DAMA_ATTEMPT"))
	if err != nil {
		return nil, fmt.Errorf("DAMA_ATTEMPT: %w", err)
	}
	fd, err := strconv.Atoi(os.Getenv("DAMA_EVENTS_FD"))
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("DAMA_EVENTS_FD %q: want a descriptor above 2", os.Getenv("DAMA_EVENTS_FD"))
	}
	// Processes the function starts do not inherit the pipe: the runner
	// waits for it to close.
	syscall.CloseOnExec(fd)
	t := &Task{
		id:      id,
		kind:    os.Getenv("DAMA_KIND"),
		attempt: attempt,
		args:    json.RawMessage(cmp.Or(os.Getenv("DAMA_ARGS"), "{}")),
		events:  os.NewFile(uintptr(fd), "events"),
	}
	if s := os.Getenv("DAMA_CHECKPOINT"); s != "" && s != "null" {
		t.last = json.RawMessage(s)
	}
	if string(t.args) == "null" {
		t.args = json.RawMessage("{}")
	}
	t.logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("etl_context_id", id, "attempt", attempt)
	return t, nil
}
