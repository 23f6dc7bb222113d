// Package task is what a task's own Go program uses to talk to dama: its
// arguments and last checkpoint, and the events pipe on which it reports
// progress, checkpoints, events of its own, children to submit and why it
// fails. A command of any kind reads them with FromEnv; a function kind's
// function gets the same Task from its task process.
//
// It writes the lines the events pipe takes (protocol.Line), so a program
// never writes that JSON by hand, and it refuses at once what the task
// process would only record as a WARNING: a reserved event type, a
// checkpoint too large to hand to a later attempt, a line over the limit.
package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/dama-etl/dama/protocol"
)

// Task is a task as its program sees it. Its methods are safe for
// concurrent use. A report fails when it is invalid (a reserved event
// type, a checkpoint too large) or cannot reach the task process; nil
// means the task process got it, not that it was recorded: what the
// database refuses (a child of an unknown kind, say) is recorded as a
// WARNING event instead, and only while this attempt is the current one.
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

// FromEnv reads the task this process runs from the environment its task
// process set (protocol's ContextIDEnv, KindEnv, AttemptEnv, ArgsEnv,
// CheckpointEnv and EventsFDEnv, a pipe), once: every call returns the
// same Task, which owns the events pipe, or the same error. The pipe is
// made close-on-exec: the task process waits for it to close, which the
// processes the program starts would hold open.
func FromEnv() (*Task, error) { return fromEnv() }

// fromEnv is FromEnv's one reading of the environment. Package state,
// because the events pipe is the process's: a second Task wrapping the
// same descriptor would close it when collected, and a later write would
// go to whatever file took the number.
var fromEnv = sync.OnceValues(readEnv)

func readEnv() (*Task, error) {
	id, err := strconv.ParseInt(os.Getenv(protocol.ContextIDEnv), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (is this program run by dama?)", protocol.ContextIDEnv, err)
	}
	attempt, err := strconv.Atoi(os.Getenv(protocol.AttemptEnv))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", protocol.AttemptEnv, err)
	}
	fd, err := strconv.Atoi(os.Getenv(protocol.EventsFDEnv))
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s %q: want a descriptor above 2", protocol.EventsFDEnv, os.Getenv(protocol.EventsFDEnv))
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return nil, fmt.Errorf("%s %d: not a pipe (is this program run by dama?)", protocol.EventsFDEnv, fd)
	}
	syscall.CloseOnExec(fd)
	t := &Task{
		id:      id,
		kind:    os.Getenv(protocol.KindEnv),
		attempt: attempt,
		args:    json.RawMessage("{}"),
		logger:  slog.New(slog.NewTextHandler(os.Stderr, nil)).With("etl_context_id", id, "attempt", attempt),
		events:  os.NewFile(uintptr(fd), "events"),
	}
	if s := os.Getenv(protocol.ArgsEnv); s != "" && s != "null" {
		t.args = json.RawMessage(s)
	}
	if s := os.Getenv(protocol.CheckpointEnv); s != "" && s != "null" {
		t.last = json.RawMessage(s)
	}
	return t, nil
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

// Logger returns a logger that writes to the task's log file (the
// program's stderr).
func (t *Task) Logger() *slog.Logger { return t.logger }

// Progress reports how far along the task is, a PROGRESS event: {"step":
// 3, "of": 10} or {"percent": 30} draw a bar in dama's views.
func (t *Task) Progress(v any) error { return t.send(protocol.EventProgress, v) }

// Checkpoint records where a later attempt may resume from, a CHECKPOINT
// event: at most protocol.MaxEnvPayload bytes as the database gives it
// back (protocol.CheckCheckpoint).
func (t *Task) Checkpoint(v any) error { return t.send(protocol.EventCheckpoint, v) }

// Event records an event of the task's own type (letters, digits and '_';
// stored upper-cased as <kind>:<TYPE>). The types dama writes itself, and
// "submit" and "failure", are refused.
func (t *Task) Event(eventType string, v any) error {
	suffix := strings.ToUpper(eventType)
	switch {
	case !protocol.ValidSuffix(suffix):
		return fmt.Errorf("event type %q: want letters, digits and '_', starting with a letter", eventType)
	case protocol.Reserved(suffix) || suffix == protocol.TypeSubmit || suffix == protocol.TypeFailure:
		return fmt.Errorf("event type %q is reserved for dama", eventType)
	}
	return t.send(suffix, v)
}

// Submit submits a child task of the given kind, a kind of the task
// process's configuration. With an idempotency key, a later attempt
// submitting the same key gets the same child rather than a second one.
// The child is created with the SUBMITTED event that names it; a kind with
// await_children waits for it once the program has succeeded.
func (t *Task) Submit(kind string, args any, idempotencyKey string) error {
	c := protocol.Child{Kind: kind, IdempotencyKey: idempotencyKey}
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return fmt.Errorf("submit a child: encode arguments: %w", err)
		}
		c.Args = b
	}
	if err := c.Check(); err != nil {
		return fmt.Errorf("submit a child: %w", err)
	}
	// JSON encoding would replace what the database cannot store, and two
	// keys that differ only there would name one child.
	if !utf8.ValidString(idempotencyKey) || strings.ContainsRune(idempotencyKey, 0) {
		return errors.New("submit a child: idempotency key: want UTF-8 text without NUL")
	}
	return t.send(protocol.TypeSubmit, c)
}

// Fail says why the program is about to fail: when it then exits non-zero,
// the attempt's ERROR event gives reason (cut to protocol.MaxFailureError
// bytes), and retry false fails the task for good. The last call counts; a
// program that exits 0 is DONE whatever it said.
func (t *Task) Fail(reason string, retry bool) error {
	if reason == "" {
		// The task process requires one; retry must not be lost for it.
		reason = "(no reason given)"
	}
	return t.send(protocol.TypeFailure, protocol.Failure{Error: protocol.TruncateUTF8(reason, protocol.MaxFailureError), Retry: &retry})
}

func (t *Task) send(suffix string, v any) error {
	what := strings.ToLower(suffix)
	payload, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("report %s: encode payload: %w", what, err)
	}
	if suffix == protocol.EventCheckpoint {
		if err := protocol.CheckCheckpoint(payload); err != nil {
			return fmt.Errorf("report %s: %w", what, err)
		}
	}
	line, err := json.Marshal(protocol.Line{Type: what, Payload: payload})
	if err != nil {
		return fmt.Errorf("report %s: %w", what, err)
	}
	if len(line) >= protocol.MaxEventLine {
		return fmt.Errorf("report %s: line of %d bytes exceeds %d bytes", what, len(line), protocol.MaxEventLine)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := t.events.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("report %s: %w", what, err)
	}
	return nil
}
